#!/usr/bin/env bash
# Builds the Go app on the host: one static binary into OUT_DIR (the image's /opt/app).
# Usage: STATEFLEET_CACHE=~/.cache/statefleet bash ./build.sh OUT_DIR
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
cache=${STATEFLEET_CACHE:-$HOME/.cache/statefleet}/go
# The modules from the registry the host's go command already uses, pinned by go.mod and go.sum;
# the caches stay out of the sources.
export GOMODCACHE=$cache/mod GOCACHE=$cache/build CGO_ENABLED=0 GOTOOLCHAIN=local
go=$(command -v go || echo /usr/local/go/bin/go)
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")"
# Its unit tests (binding selection, the error kinds) first: a wrong kind would fail the e2e
# test for the wrong reason.
"$go" test -mod=readonly -buildvcs=false ./...
"$go" build -mod=readonly -buildvcs=false -trimpath -ldflags='-s -w' -o "$out/binding-app" .
