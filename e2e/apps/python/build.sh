#!/usr/bin/env bash
# Runs on the host: installs the pinned wheels for the image's Python (Debian bookworm's 3.11)
# into OUT_DIR/lib, beside the app. Nothing is installed at run time.
# Usage: STATEFLEET_CACHE=~/.cache/statefleet bash ./build.sh OUT_DIR
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
cache=${STATEFLEET_CACHE:-$HOME/.cache/statefleet}/pip
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
rm -rf "${out:?}/lib"
# Wheels for the image, not for the host: its CPython 3.11 ABI and glibc (pymongo's and
# PyYAML's C extensions), whatever Python the host runs.
python3 -m pip install --quiet --no-input --disable-pip-version-check --root-user-action=ignore --cache-dir "$cache" \
  --require-hashes --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --target "$out/lib" -r "$here/requirements.txt"
rm -rf "$out/lib/bin" # console scripts written for the host's interpreter
cp "$here/app.py" "$out/app.py"
