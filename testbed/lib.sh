# Shared settings for the test bed scripts. Sourced, never run.
# shellcheck shell=bash disable=SC2034  # the settings are used by the scripts that source this
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TESTBED_SRC=$REPO/testbed
TB=$REPO/.testbed                                   # repo-local state (git-ignored)
CACHE=${STATEFLEET_CACHE:-$HOME/.cache/statefleet}  # build caches, kept across runs
# Runtime state that must not depend on the checkout: a killed run in another clone
# leaves its sockets, mounts and containers here, and the next run finds them.
RUN=/run/statefleet

KUBE_VERSION=1.37.2
COREDNS_VERSION=1.14.2
KWOK_VERSION=0.8.0
HELM_VERSION=3.22.0
S3_VERSION=1.8.0 # Versity S3 Gateway
CERT_MANAGER_VERSION=1.21.2
FERRETDB_VERSION=1.24.2
KUBE_ROUTER_VERSION=2.1.0 # as a NetworkPolicy controller only

KUBE_BIN=$CACHE/bin/kube-v$KUBE_VERSION
COREDNS_BIN=$CACHE/bin/coredns-v$COREDNS_VERSION
KWOK_BIN=$CACHE/bin/kwok-v$KWOK_VERSION
HELM_BIN=$CACHE/bin/helm-v$HELM_VERSION
S3_BIN=$CACHE/bin/versitygw-v$S3_VERSION
CERT_MANAGER_BIN=$CACHE/bin/cert-manager-v$CERT_MANAGER_VERSION  # the binary, and its CRDs in crds/
FERRETDB_BIN=$CACHE/bin/ferretdb-v$FERRETDB_VERSION
KUBE_ROUTER_BIN=$CACHE/bin/kube-router-v$KUBE_ROUTER_VERSION
LINEARIZABILITY_BIN=$CACHE/bin/linearizability  # the chaos test's history checker (porcupine)
# kubeconform and kube-score, with the OpenAPI document of the Kubernetes module (its schemas)
MANIFEST_CHECKS_BIN=$CACHE/bin/manifest-checks-v$KUBE_VERSION

# One node bridge carries the pods, the node address and the API server: it is
# internal to this machine, so nothing listens on an outside interface.
BRIDGE=statefleet0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/16
NODE_POD_RANGE_START=10.244.1.2
NODE_POD_RANGE_END=10.244.255.254
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10
CLUSTER_DOMAIN=cluster.local
NODE_NAME=testbed-node
API_PORT=6443
ETCD_CLIENT_PORT=2379
ETCD_PEER_PORT=2380
# The S3 server listens on the node bridge: pods and the host reach it at the same address.
S3_PORT=9000
S3_ENDPOINT=http://$NODE_IP:$S3_PORT
S3_ENV=$TB/s3.env # S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
# The same store over TLS (the test bed's CA), for clients that speak S3 only over HTTPS
# (pgBackRest before 2.58, in the benchmarks); its certificate names NODE_IP and localhost.
S3_TLS_PORT=9443
S3_TLS_ENV=$TB/s3-tls.env # S3_TLS_ENDPOINT, S3_CA_FILE

CONTAINERD_SOCK=$RUN/containerd.sock
CTR=(ctr --address "$CONTAINERD_SOCK" --namespace k8s.io)
KUBECONFIG_ADMIN=$TB/kubeconfig
KUBECTL=$TB/bin/kubectl
HELM=$TB/bin/helm

log() { printf '%s testbed: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# Pinned tool versions into a Go module directory and a stamp naming what was built.
recipe_hash() { cat "$@" | sha256sum | cut -c1-16; }

kubectl_admin() { "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s.
wait_for() {
  local timeout=$1 what=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $what"
    sleep 0.2
  done
}
