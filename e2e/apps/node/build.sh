#!/usr/bin/env bash
# Runs on the host: the app and its production node_modules (pure JavaScript, so the host's
# build runs on the image's Node.js) into OUT_DIR.
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
cache=${STATEFLEET_CACHE:?STATEFLEET_CACHE must be set}/npm
mkdir -p "$out" "$cache"
cp package.json package-lock.json app.js "$out/"
cd "$out"
npm ci --prefer-offline --omit=dev --ignore-scripts --no-audit --no-fund --cache "$cache" --loglevel=warn
