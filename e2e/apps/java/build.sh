#!/usr/bin/env bash
# Builds the Java test application on the host (JDK 17, Maven) and writes what its image needs
# into OUT_DIR: the application jar and lib/ (Spring Boot's extracted layout, whose plain jars
# AppCDS can archive; a nested fat jar it cannot). install.sh makes the class data archive in the
# image, where the runtime JDK is the one it must match.
# Usage: STATEFLEET_CACHE=~/.cache/statefleet bash ./build.sh OUT_DIR   (run from a copy of this folder)
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
cache=${STATEFLEET_CACHE:-$HOME/.cache/statefleet}
mkdir -p "$cache/maven" "$out"
# package runs Spring AOT (process-aot): the bean definitions are generated at build time.
mvn -q -B -Dmaven.repo.local="$cache/maven" package
java -Djarmode=tools -jar target/binding-app.jar extract --force --destination "$out"
