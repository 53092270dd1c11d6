#!/usr/bin/env bash
# Builds the test bed's container images from Debian packages, without a registry or a
# container engine: debootstrap a rootfs, run the image's recipe in a chroot, pack it
# as a docker archive. Each archive is cached under a hash of its recipe, so an image
# is rebuilt only when its recipe changes.
#
# Usage: build.sh [IMAGE_DIR_NAME...]   (default: every image)
# shellcheck source=testbed/lib.sh
source "$(dirname "$0")/../lib.sh"

IMAGES_SRC=$TESTBED_SRC/images
IMAGES_OUT=$CACHE/images
ROOTFS_CACHE=$CACHE/rootfs
mkdir -p "$IMAGES_OUT" "$ROOTFS_CACHE"
# Builds sharing this cache take turns (a test bed starting while an image is built by hand).
exec 9>"$IMAGES_OUT/.lock"
flock 9
# What a killed build left: its chroot's mounts first, then its folders.
for stale in "$IMAGES_OUT"/.build-* "$ROOTFS_CACHE"/.debootstrap-*; do
  [[ -e $stale ]] || continue
  awk '{print $2}' /proc/self/mounts | grep -F "$stale/" | sort -r | xargs -r -n1 umount -l
  rm -rf "$stale"
done

debian_mirror() {
  # The host's own apt source, so the images come from the same Debian it trusts.
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [[ -n $uri ]] || uri=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [[ -n $uri ]] || die "no Debian mirror found in /etc/apt/sources.list{,.d}"
  echo "$uri"
}

# base_rootfs SUITE -> path of a cached minbase tar for that Debian suite.
base_rootfs() {
  local suite=$1 tar=$ROOTFS_CACHE/$1-minbase.tar
  if [[ ! -f $tar ]]; then
    command -v debootstrap >/dev/null || die "debootstrap missing (make deps installs it)"
    local dir
    dir=$(mktemp -d "$ROOTFS_CACHE/.debootstrap-$suite.XXXX")
    chmod 0755 "$dir" # it becomes the image's /
    log "debootstrap $suite (about a minute)"
    debootstrap --variant=minbase --include=ca-certificates "$suite" "$dir" "$(debian_mirror)" >"$dir.log" 2>&1 ||
      die "debootstrap $suite failed: see $dir.log"
    tar --numeric-owner --xattrs --xattrs-include='*' -C "$dir" -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
    rm -rf "$dir" "$dir.log"
  fi
  echo "$tar"
}

CHROOT_MOUNTS=()
unmount_chroot() {
  local m
  for ((i = ${#CHROOT_MOUNTS[@]} - 1; i >= 0; i--)); do
    m=${CHROOT_MOUNTS[i]}
    if mountpoint -q "$m"; then umount -l "$m"; fi
  done
  CHROOT_MOUNTS=()
}
WORK=""
# A failed build leaves neither mounts nor its half-made rootfs behind.
cleanup() {
  unmount_chroot
  if [[ -n $WORK ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

# build_debian_rootfs IMAGE_SRC ROOTFS: base suite + files + install.sh in a chroot.
build_debian_rootfs() {
  local src=$1 rootfs=$2
  tar --numeric-owner --xattrs --xattrs-include='*' -C "$rootfs" -xf "$(base_rootfs "$SUITE")"
  chmod 0755 "$rootfs" # the base tar keeps its mktemp folder's 0700: no other user could reach /
  local mirror
  mirror=$(debian_mirror)
  printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$SUITE" "$mirror" "$SUITE" >"$rootfs/etc/apt/sources.list"
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d" # no daemons start during the build
  chmod +x "$rootfs/usr/sbin/policy-rc.d"
  [[ -d $src/rootfs ]] && cp -a "$src/rootfs/." "$rootfs/"
  cp "$src/install.sh" "$rootfs/tmp/install.sh"
  [[ -n ${EXTRA_CONTEXT:-} ]] && cp -a "$EXTRA_CONTEXT" "$rootfs/tmp/context"
  if [[ -n ${HOST_BUILD:-} ]]; then
    # An application built on the host (its toolchain, the registries' caches) from a copy of
    # its sources; its build.sh writes what the image needs into the chroot's /tmp/context.
    local sources=$rootfs/../sources
    mkdir -p "$sources" "$rootfs/tmp/context"
    tar -C "$REPO/$HOST_BUILD" --exclude=./node_modules --exclude=./target -cf - . | tar -C "$sources" -xf -
    (cd "$sources" && STATEFLEET_CACHE=$CACHE bash ./build.sh "$rootfs/tmp/context") >"$rootfs/../host-build.log" 2>&1 ||
      die "building $HOST_BUILD on the host failed: $(tail -n 30 "$rootfs/../host-build.log")"
    rm -rf "$sources"
  fi
  mount -t proc proc "$rootfs/proc" && CHROOT_MOUNTS+=("$rootfs/proc")
  # The host's trust store and package index settings, for the build only (/tmp is emptied):
  # the machine may reach the registries through a proxy with its own CA.
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/tmp/host-ca.crt"
  local host_env=(PIP_CERT=/tmp/host-ca.crt SSL_CERT_FILE=/tmp/host-ca.crt REQUESTS_CA_BUNDLE=/tmp/host-ca.crt)
  local var
  for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [[ -n ${!var:-} ]] && host_env+=("$var=${!var}")
  done
  # shellcheck disable=SC2086 # BUILD_ARGS is a list of NAME=VALUE words
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
    "${host_env[@]}" $BUILD_ARGS chroot "$rootfs" /bin/bash -euo pipefail /tmp/install.sh
  unmount_chroot
  # Leave no build-time state in the image.
  rm -rf "$rootfs/tmp/"* "$rootfs/var/lib/apt/lists/"* "$rootfs/var/cache/apt/"*.bin \
    "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/usr/sbin/policy-rc.d" "$rootfs/var/log/"*.log
  : >"$rootfs/etc/resolv.conf"
}

# build_static_rootfs IMAGE_SRC ROOTFS: a single static program, for pause and CoreDNS.
build_static_rootfs() {
  local src=$1 rootfs=$2
  mkdir -p "$rootfs"/{bin,etc,tmp}
  [[ -d $src/rootfs ]] && cp -a "$src/rootfs/." "$rootfs/"
  case $STATIC_PROGRAM in
    pause)
      local pause_c
      pause_c=$(cd "$TESTBED_SRC/gomod/kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
      gcc -Os -static -Wall -Werror -DVERSION="v$PAUSE_VERSION" -o "$rootfs/pause" "$pause_c"
      strip "$rootfs/pause"
      ;;
    coredns)
      cp "$COREDNS_BIN/coredns" "$rootfs/coredns"
      cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ca-certificates.crt"
      ;;
    ferretdb)
      cp "$FERRETDB_BIN/ferretdb" "$rootfs/ferretdb"
      chmod 1777 "$rootfs/tmp" # SQLite's temporary files, whoever the server runs as
      ;;
    *) die "unknown static program $STATIC_PROGRAM" ;;
  esac
}

build_image() {
  local name=$1 src=$IMAGES_SRC/$1
  [[ -f $src/image.conf ]] || die "no image recipe $src/image.conf"
  local REF KIND SUITE STATIC_PROGRAM EXTRA_CONTEXT="" RECIPE=$1 BUILD_ARGS="" PAUSE_VERSION=3.10.2 BASE="" CODE_PATHS="" HOST_BUILD=""
  # shellcheck source=/dev/null
  source "$src/image.conf"
  local recipe=$IMAGES_SRC/$RECIPE base_archive=""
  local hash_inputs=("$IMAGES_SRC/build.sh" "$IMAGES_SRC/pack.py") file code=()
  for file in $CODE_PATHS $HOST_BUILD; do code+=("$REPO/$file"); done
  while IFS= read -r file; do hash_inputs+=("$file"); done < <(
    find "$src" "$recipe" ${EXTRA_CONTEXT:+"$EXTRA_CONTEXT"} "${code[@]}" -type f -not -path '*/__pycache__/*' \
      -not -path '*/node_modules/*' -not -path '*/target/*' | sort
  )
  [[ $KIND == static && $STATIC_PROGRAM == coredns ]] && hash_inputs+=("$COREDNS_BIN/.stamp")
  [[ $KIND == static && $STATIC_PROGRAM == ferretdb ]] && hash_inputs+=("$FERRETDB_BIN/.stamp")
  if [[ $KIND == overlay ]]; then
    build_image "$BASE"
    read -r base_archive _ <"$IMAGES_OUT/$BASE.current"
    hash_inputs+=("$IMAGES_OUT/$BASE.current")
  fi
  local hash archive
  hash=$(recipe_hash "${hash_inputs[@]}")
  REF=${REF//@HASH@/$hash} # an image whose tag follows its content, so a new build rolls out
  archive=$IMAGES_OUT/$name-$hash.tar
  if [[ -f $archive ]]; then
    echo "$archive $REF" >"$IMAGES_OUT/$name.current"
    return 0
  fi
  log "building image $REF ($name, recipe $hash)"
  local started=$SECONDS work
  work=$(mktemp -d "$IMAGES_OUT/.build-$name.XXXX")
  WORK=$work
  mkdir -p "$work/rootfs"
  case $KIND in
    debian) build_debian_rootfs "$recipe" "$work/rootfs" ;;
    static) build_static_rootfs "$recipe" "$work/rootfs" ;;
    overlay) # the repository's code, read-only, on top of BASE's layers
      mkdir -p "$work/rootfs/opt/statefleet/app"
      (cd "$REPO" && tar --exclude=__pycache__ -cf - $CODE_PATHS) | tar -C "$work/rootfs/opt/statefleet/app" -xf -
      chown -R 0:0 "$work/rootfs"
      chmod -R a+rX,go-w "$work/rootfs"
      ;;
    *) die "$src/image.conf: KIND must be debian, static or overlay, not '$KIND'" ;;
  esac
  tar --numeric-owner --xattrs --xattrs-include='*' -C "$work/rootfs" \
    --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -cf "$work/layer.tar" .
  # config.json may name BUILD_ARGS variables, e.g. ${PG_MAJOR}.
  env $BUILD_ARGS python3 -c 'import os, sys; print(os.path.expandvars(open(sys.argv[1]).read()))' \
    "$recipe/config.json" >"$work/config.json"
  python3 "$IMAGES_SRC/pack.py" --out "$work/image.tar" --ref "$REF" --config "$work/config.json" \
    ${base_archive:+--base "$base_archive"} "$work/layer.tar"
  rm -f "$IMAGES_OUT/$name-"*.tar # older recipes of this image
  mv "$work/image.tar" "$archive"
  rm -rf "$work"
  WORK=""
  log "built image $REF in $((SECONDS - started))s ($(du -h "$archive" | cut -f1))"
  echo "$archive $REF" >"$IMAGES_OUT/$name.current"
}

# Every recipe (a folder with an image.conf): the test bed's own images and each service's
# servers, which the services' catalogs name (tests/unit/test_image_recipes.py checks both agree).
mapfile -t ALL_IMAGES < <(cd "$IMAGES_SRC" && for conf in */image.conf; do dirname "$conf"; done)
for image in "${@:-${ALL_IMAGES[@]}}"; do
  build_image "$image"
done
