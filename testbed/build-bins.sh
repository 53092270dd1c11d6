#!/usr/bin/env bash
# Builds the test bed's Go programs from the Go module proxy, each into a versioned
# folder of the cache; a folder whose stamp matches its recipe is left alone.
# shellcheck source=testbed/lib.sh
source "$(dirname "$0")/lib.sh"

GO_LDFLAGS_BASE="-s -w"

# build_once OUT_DIR GOMOD_DIR LDFLAGS PACKAGE...
#   PREPARE: a command run first, only when building; GO_MODFILE: a `go build -modfile`;
#   RECIPE_EXTRA: another file whose change means a rebuild
build_once() {
  local out=$1 moddir=$2 ldflags=$3
  shift 3
  local stamp
  stamp=$(recipe_hash "$moddir/go.mod" "$moddir/go.sum" "$TESTBED_SRC/build-bins.sh" ${RECIPE_EXTRA:+"$RECIPE_EXTRA"})
  if [[ -f $out/.stamp && $(cat "$out/.stamp") == "$stamp" ]]; then
    return 0
  fi
  log "building $(basename "$out") (minutes when Go's build cache is cold)"
  mkdir -p "$out"
  local started=$SECONDS
  [[ -z ${PREPARE:-} ]] || $PREPARE
  (cd "$moddir" && go build -trimpath ${GO_MODFILE:+-modfile "$GO_MODFILE"} -ldflags "$ldflags" -o "$out/" "$@")
  echo "$stamp" >"$out/.stamp"
  log "built $(basename "$out") in $((SECONDS - started))s"
}

kube_ldflags=$GO_LDFLAGS_BASE
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  minor=${KUBE_VERSION#1.}
  minor=${minor%%.*}
  kube_ldflags+=" -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
build_once "$KUBE_BIN" "$TESTBED_SRC/gomod/kube" "$kube_ldflags" \
  ./etcd \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy \
  k8s.io/kubernetes/cmd/kubectl

# Static: the binary goes alone into its container image.
CGO_ENABLED=0 build_once "$COREDNS_BIN" "$TESTBED_SRC/gomod/coredns" "$GO_LDFLAGS_BASE" github.com/coredns/coredns
# kwok with one fix of ours (gomod/kwok/uid_precondition.py): its module, patched, replaces
# the original through a go.mod of its own (the wrapper's go.sum still checks the rest).
KWOK_PATCHED=$CACHE/kwok-patched
patch_kwok() {
  local original
  original=$(cd "$TESTBED_SRC/gomod/kwok" && go mod download -json sigs.k8s.io/kwok |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$KWOK_PATCHED"
  mkdir -p "$KWOK_PATCHED"
  cp -r "$original" "$KWOK_PATCHED/kwok"
  chmod -R u+w "$KWOK_PATCHED/kwok"
  python3 "$TESTBED_SRC/gomod/kwok/uid_precondition.py" "$KWOK_PATCHED/kwok/pkg/kwok/controllers/pod_controller.go"
  cp "$TESTBED_SRC/gomod/kwok/go.mod" "$TESTBED_SRC/gomod/kwok/go.sum" "$KWOK_PATCHED/"
  go mod edit -replace "sigs.k8s.io/kwok=$KWOK_PATCHED/kwok" "$KWOK_PATCHED/go.mod"
}
PREPARE=patch_kwok GO_MODFILE=$KWOK_PATCHED/go.mod RECIPE_EXTRA=$TESTBED_SRC/gomod/kwok/uid_precondition.py \
  CGO_ENABLED=0 build_once "$KWOK_BIN" "$TESTBED_SRC/gomod/kwok" \
  "$GO_LDFLAGS_BASE -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok

CGO_ENABLED=0 build_once "$HELM_BIN" "$TESTBED_SRC/gomod/helm" \
  "$GO_LDFLAGS_BASE -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" helm.sh/helm/v3/cmd/helm

CGO_ENABLED=0 build_once "$S3_BIN" "$TESTBED_SRC/gomod/s3" \
  "$GO_LDFLAGS_BASE -X main.Version=v$S3_VERSION" \
  github.com/versity/versitygw/cmd/versitygw

# kube-router, run on the node as the NetworkPolicy enforcer only (up.sh): nothing else on the
# test bed enforces NetworkPolicies.
CGO_ENABLED=0 build_once "$KUBE_ROUTER_BIN" "$TESTBED_SRC/gomod/kuberouter" \
  "$GO_LDFLAGS_BASE -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=v$KUBE_ROUTER_VERSION" \
  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router

# cert-manager's controllers under a main of ours (gomod/certmanager/main.go), with the
# CRDs its module publishes; e2e installs both only for the cert-manager test.
# FerretDB reads its version at start from a file its module does not ship: built from a copy
# that has it.
FERRETDB_PATCHED=$CACHE/ferretdb-patched
patch_ferretdb() {
  local original
  original=$(cd "$TESTBED_SRC/gomod/ferretdb" && go mod download -json github.com/FerretDB/FerretDB |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$FERRETDB_PATCHED"
  mkdir -p "$FERRETDB_PATCHED"
  cp -r "$original" "$FERRETDB_PATCHED/FerretDB"
  chmod -R u+w "$FERRETDB_PATCHED/FerretDB"
  echo "v$FERRETDB_VERSION" >"$FERRETDB_PATCHED/FerretDB/build/version/version.txt"
  cp "$TESTBED_SRC/gomod/ferretdb/go.mod" "$TESTBED_SRC/gomod/ferretdb/go.sum" "$FERRETDB_PATCHED/"
  go mod edit -replace "github.com/FerretDB/FerretDB=$FERRETDB_PATCHED/FerretDB" "$FERRETDB_PATCHED/go.mod"
}
PREPARE=patch_ferretdb GO_MODFILE=$FERRETDB_PATCHED/go.mod CGO_ENABLED=0 build_once "$FERRETDB_BIN" \
  "$TESTBED_SRC/gomod/ferretdb" "$GO_LDFLAGS_BASE" github.com/FerretDB/FerretDB/cmd/ferretdb

copy_cert_manager_crds() {
  local module
  module=$(cd "$TESTBED_SRC/gomod/certmanager" && go mod download -json github.com/cert-manager/cert-manager |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$CERT_MANAGER_BIN/crds"
  cp "$module"/deploy/crds/cert-manager.io_*.yaml "$module"/deploy/crds/acme.cert-manager.io_*.yaml \
    "$CERT_MANAGER_BIN/crds/"
}
PREPARE=copy_cert_manager_crds RECIPE_EXTRA=$TESTBED_SRC/gomod/certmanager/main.go \
  CGO_ENABLED=0 build_once "$CERT_MANAGER_BIN" "$TESTBED_SRC/gomod/certmanager" "$GO_LDFLAGS_BASE" .

# The chaos test's history checker: porcupine under a model of ours (gomod/linearizability).
RECIPE_EXTRA=$TESTBED_SRC/gomod/linearizability/main.go \
  CGO_ENABLED=0 build_once "$LINEARIZABILITY_BIN" "$TESTBED_SRC/gomod/linearizability" "$GO_LDFLAGS_BASE" .

# The offline manifest checks (e2e/test_manifests.py): kubeconform against schemas made from
# the OpenAPI v3 documents of the Kubernetes release the test bed runs, and kube-score.
copy_kube_openapi() {
  local module
  module=$(cd "$TESTBED_SRC/gomod/kube" && go mod download -json k8s.io/kubernetes |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$MANIFEST_CHECKS_BIN/openapi-v3"
  mkdir -p "$MANIFEST_CHECKS_BIN"
  cp -r "$module/api/openapi-spec/v3" "$MANIFEST_CHECKS_BIN/openapi-v3"
  chmod -R u+w "$MANIFEST_CHECKS_BIN/openapi-v3"
}
PREPARE=copy_kube_openapi CGO_ENABLED=0 build_once "$MANIFEST_CHECKS_BIN" "$TESTBED_SRC/gomod/manifests" \
  "$GO_LDFLAGS_BASE" github.com/yannh/kubeconform/cmd/kubeconform github.com/zegl/kube-score/cmd/kube-score

mkdir -p "$TB/bin"
ln -sfn "$KUBE_BIN/kubectl" "$KUBECTL"
ln -sfn "$HELM_BIN/helm" "$HELM"
ln -sfn "$CERT_MANAGER_BIN" "$TB/bin/cert-manager"
ln -sfn "$LINEARIZABILITY_BIN/linearizability" "$TB/bin/linearizability"
ln -sfn "$MANIFEST_CHECKS_BIN" "$TB/bin/manifest-checks"
