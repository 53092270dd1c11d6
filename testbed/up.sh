#!/usr/bin/env bash
# Starts the test bed: etcd, the control plane, a real node (containerd + kubelet +
# kube-proxy), CoreDNS and kwok's simulated nodes. Builds whatever is missing first.
# Idempotent: a healthy test bed is left as it is; anything else is cleaned up and
# started again.
# shellcheck source=testbed/lib.sh
source "$(dirname "$0")/lib.sh"

[[ $(id -u) == 0 ]] || die "the test bed runs a kubelet and containerd: run it as root"
[[ -x $REPO/.venv/bin/python ]] || die "no Python venv: run 'make deps'"
# (mvn, npm: the binding test applications' images are built with the host's toolchains.)
for tool in containerd ctr runc iptables iptables-save ipset openssl debootstrap go gcc mvn npm; do
  command -v "$tool" >/dev/null || die "$tool missing: run 'make deps' (it installs the Debian packages)"
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || die "CNI plugins missing: run 'make deps'"

# Healthy means every part answers: the API, the node, cluster DNS, kwok, local volumes.
healthy() {
  [[ -f $KUBECONFIG_ADMIN && -x $KUBECTL ]] || return 1
  kubectl_admin get --raw /readyz >/dev/null 2>&1 || return 1
  [[ $(kubectl_admin get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]] || return 1
  [[ $(kubectl_admin -n kube-system get deployment coredns -o 'jsonpath={.status.availableReplicas}') -ge 1 ]] || return 1
  local daemon
  for daemon in kwok local-volumes s3 kube-router; do
    kill -0 "$(cat "$TB/pids/$daemon.pid" 2>/dev/null)" 2>/dev/null || return 1
  done
}
# Import each image whose current archive is not the one imported last.
import_images() {
  local current archive ref marker
  for current in "$CACHE"/images/*.current; do
    read -r archive ref <"$current"
    marker=$CACHE/containerd/imported-$(basename "$current" .current)
    if [[ $(cat "$marker" 2>/dev/null) != "$archive" ]] || ! grep -qxF "$ref" <<<"$("${CTR[@]}" images ls -q)"; then
      log "importing $ref into containerd"
      "${CTR[@]}" images import "$archive" >/dev/null
      echo "$archive" >"$marker"
    fi
  done
}

started=$SECONDS
"$TESTBED_SRC/build-bins.sh"
"$TESTBED_SRC/images/build.sh"
# What building took, for `make test`'s budget line (a fresh machine has a larger budget).
mkdir -p "$TB/logs"
printf '{"seconds": %d, "finished_at": %d}\n' "$((SECONDS - started))" "$(date +%s)" >"$TB/logs/testbed-build.json"
bins_stamp=$(cat "$KUBE_BIN/.stamp" "$COREDNS_BIN/.stamp" "$KWOK_BIN/.stamp" "$KUBE_ROUTER_BIN/.stamp")
if healthy 2>/dev/null && [[ $(cat "$RUN/bins.stamp" 2>/dev/null) == "$bins_stamp" ]]; then
  import_images # a changed image recipe takes effect without a restart
  log "already up (kubeconfig: $KUBECONFIG_ADMIN)"
  exit 0
fi
"$TESTBED_SRC/down.sh" --quiet # whatever a killed or half-started run left behind

mkdir -p "$TB"/{logs,pids,etcd,kubelet,cni/net.d} "$RUN"
echo "$bins_stamp" >"$RUN/bins.stamp"

# start_daemon NAME COMMAND...: in its own session, so it outlives make; logs in .testbed/logs.
start_daemon() {
  local name=$1
  shift
  setsid "$@" </dev/null >"$TB/logs/$name.log" 2>&1 &
  echo $! >"$TB/pids/$name.pid"
  echo "$TB/pids/$name.pid" >>"$RUN/pidfiles"
}

# --- host network: the node bridge, forwarding, bridged traffic through iptables -----
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  vm.overcommit_memory kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.conf.all.route_localnet)
for key in "${SYSCTLS[@]}"; do
  value=$(sysctl -n "$key" 2>/dev/null) && echo "$key=$value"
done >"$RUN/sysctl.saved"
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
ip link add "$BRIDGE" type bridge
ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
ip link set "$BRIDGE" up

"$TESTBED_SRC/pki.sh"
PKI=$TB/pki

# --- containerd (Debian's), with its images in the cache so they survive a restart ----
mkdir -p "$CACHE/containerd/root"
cat >"$RUN/containerd.toml" <<EOF
version = 2
root = "$CACHE/containerd/root"
state = "$RUN/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$RUN/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CACHE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/statefleet/pause:3.10.2"
  # This machine refuses a negative oom_score_adj even to root (runc fails with
  # "failed to update /proc/self/oom_score_adj: Permission denied"): clamp it to ours.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/bin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$TB/cni/net.d"
EOF
cat >"$TB/cni/net.d/10-statefleet.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "statefleet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$RUN/cni-ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "rangeStart": "$NODE_POD_RANGE_START",
                     "rangeEnd": "$NODE_POD_RANGE_END", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
start_daemon containerd containerd --config "$RUN/containerd.toml"
wait_for 30 containerd "${CTR[@]}" version

import_images

# --- etcd and the control plane, on loopback and the node bridge only -----------------
start_daemon etcd "$KUBE_BIN/etcd" --name testbed --data-dir "$TB/etcd" \
  --listen-client-urls "https://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "https://127.0.0.1:$ETCD_CLIENT_PORT" \
  --listen-peer-urls "https://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "https://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "testbed=https://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls http://127.0.0.1:2381 \
  --cert-file "$PKI/etcd-server.crt" --key-file "$PKI/etcd-server.key" --client-cert-auth --trusted-ca-file "$PKI/ca.crt" \
  --peer-cert-file "$PKI/etcd-server.crt" --peer-key-file "$PKI/etcd-server.key" --peer-client-cert-auth \
  --peer-trusted-ca-file "$PKI/ca.crt" --unsafe-no-fsync --quota-backend-bytes 8589934592 --log-level warn
wait_for 30 etcd curl -sf http://127.0.0.1:2381/health

start_daemon kube-apiserver "$KUBE_BIN/kube-apiserver" \
  --advertise-address "$NODE_IP" --bind-address "$NODE_IP" --secure-port "$API_PORT" \
  --etcd-servers "https://127.0.0.1:$ETCD_CLIENT_PORT" --etcd-cafile "$PKI/ca.crt" \
  --etcd-certfile "$PKI/apiserver-etcd-client.crt" --etcd-keyfile "$PKI/apiserver-etcd-client.key" \
  --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
  --service-account-issuer "https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" --authorization-mode Node,RBAC \
  --enable-admission-plugins NodeRestriction --allow-privileged=true --profiling=false \
  --max-requests-inflight 800 --max-mutating-requests-inflight 400
wait_for 60 "kube-apiserver /readyz" kubectl_admin get --raw /readyz

start_daemon kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
  --kubeconfig "$PKI/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$PKI/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
  --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" --controllers '*,bootstrapsigner,tokencleaner' \
  --kube-api-qps 200 --kube-api-burst 400 --concurrent-statefulset-syncs 10
# The client limits of a large cluster's scheduler (the default, 50 requests a second, binds
# a batch of 500 pods in 10 s: the scale benchmarks would measure that, not our controllers).
cat >"$RUN/kube-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: "$PKI/scheduler.kubeconfig", qps: 300, burst: 600}
leaderElection: {leaderElect: false}
EOF
start_daemon kube-scheduler "$KUBE_BIN/kube-scheduler" --config "$RUN/kube-scheduler.yaml" \
  --authentication-kubeconfig "$PKI/scheduler.kubeconfig" \
  --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
  --bind-address 127.0.0.1

# --- the real node ----------------------------------------------------------------------
cat >"$TB/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
# This machine's cgroups are v1 (plus an empty unified hierarchy).
failCgroupV1: false
failSwapOn: false
clusterDNS: [$DNS_SERVICE_IP]
clusterDomain: $CLUSTER_DOMAIN
resolvConf: /etc/resolv.conf
# Images are imported, never pulled: garbage-collecting one would break every pod using it.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
serializeImagePulls: false
oomScoreAdj: 0 # a negative value is refused here (see containerd's restrict_oom_score_adj)
maxPods: 110
EOF
start_daemon kubelet "$KUBE_BIN/kubelet" --config "$TB/kubelet/config.yaml" \
  --kubeconfig "$PKI/kubelet-client.kubeconfig" --root-dir "$TB/kubelet/root" \
  --node-ip "$NODE_IP" --hostname-override "$NODE_NAME" --cert-dir "$TB/kubelet/pki"
start_daemon kube-proxy "$KUBE_BIN/kube-proxy" --kubeconfig "$PKI/kube-proxy.kubeconfig" \
  --hostname-override "$NODE_NAME" --cluster-cidr "$POD_CIDR" --proxy-mode iptables \
  --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 \
  --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
  --iptables-localhost-nodeports=false --oom-score-adj 0
wait_for 90 "node $NODE_NAME Ready" bash -c \
  "[[ \$('$KUBECTL' --kubeconfig '$KUBECONFIG_ADMIN' get node $NODE_NAME -o 'jsonpath={.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"

# A Service address kube-proxy has not translated (a Service made a moment ago, before its next
# sync) is refused here: sent on, it would leave by the machine's default route, whose gateway
# may answer anything (an HTTP 400 where a test expected PostgreSQL). down.sh removes the rules.
for chain in OUTPUT FORWARD; do
  unserved=(-d "$SERVICE_CIDR" -m comment --comment statefleet-testbed-unserved -j REJECT)
  iptables -w -C "$chain" "${unserved[@]}" 2>/dev/null || iptables -w -I "$chain" 1 "${unserved[@]}"
done

# --- NetworkPolicies: kube-router enforces them on the node, as a firewall only (the bridge
# routes, kube-proxy serves the Services). Its chains (KUBE-ROUTER-*, KUBE-POD-FW-*,
# KUBE-NWPLCY-*, jumped to from INPUT, FORWARD and OUTPUT) match packets from or to this node's
# pods' addresses only, and its ipsets (KUBE-SRC-*, KUBE-DST-*) hold pod addresses: the host's
# own traffic passes as before. Traffic from the node itself (the kubelet's probes, an operator
# run on the host) reaches every pod. down.sh removes its chains and ipsets.
kubectl_admin apply -f "$TESTBED_SRC/manifests/kube-router.yaml" >/dev/null
start_daemon kube-router "$KUBE_ROUTER_BIN/kube-router" --kubeconfig "$PKI/kube-router.kubeconfig" \
  --hostname-override "$NODE_NAME" --run-firewall=true --run-router=false --run-service-proxy=false \
  --enable-cni=false --enable-ipv6=false --service-cluster-ip-range "$SERVICE_CIDR" \
  --health-port 0 --metrics-port 0
wait_for 60 "kube-router's NetworkPolicy chains" iptables -w -n -L KUBE-NWPLCY-DEFAULT

# --- cluster add-ons: CoreDNS, kwok ------------------------------------------------------
kubectl_admin apply -f "$TESTBED_SRC/manifests/coredns.yaml" -f "$TESTBED_SRC/manifests/storage.yaml" >/dev/null
start_daemon local-volumes "$REPO/.venv/bin/python" "$TESTBED_SRC/local_volumes.py" \
  --kubeconfig "$KUBECONFIG_ADMIN" --base-dir "$TB/volumes" --real-node "$NODE_NAME"
"$TESTBED_SRC/kwok.sh" start
# --- S3: a real S3 server on the node bridge, its keys kept across restarts ----------------
if [[ ! -f $S3_ENV ]]; then
  umask 077
  printf 'S3_ENDPOINT=%s\nAWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' "$S3_ENDPOINT" \
    "statefleet-$(openssl rand -hex 4)" "$(openssl rand -hex 20)" >"$S3_ENV"
fi
mkdir -p "$TB/s3/data" "$TB/s3/iam"
(
  set -a
  # shellcheck source=/dev/null
  source "$S3_ENV"
  export ROOT_ACCESS_KEY=$AWS_ACCESS_KEY_ID ROOT_SECRET_KEY=$AWS_SECRET_ACCESS_KEY
  # Its own users (tests make and revoke keys: e2e/s3.py), a revoked key refused at once.
  start_daemon s3 "$S3_BIN/versitygw" --port "$NODE_IP:$S3_PORT" --region us-east-1 \
    --iam-dir "$TB/s3/iam" --iam-cache-disable posix "$TB/s3/data"
  start_daemon s3-tls "$S3_BIN/versitygw" --port "$NODE_IP:$S3_TLS_PORT" --region us-east-1 \
    --cert "$PKI/s3-server.crt" --key "$PKI/s3-server.key" \
    --iam-dir "$TB/s3/iam" --iam-cache-disable posix "$TB/s3/data"
)
printf 'S3_TLS_ENDPOINT=https://%s:%s\nS3_CA_FILE=%s\n' "$NODE_IP" "$S3_TLS_PORT" "$PKI/ca.crt" >"$S3_TLS_ENV"
wait_for 30 "S3 server" bash -c "curl -s -o /dev/null $S3_ENDPOINT"
wait_for 30 "S3 server over TLS" bash -c "curl -s -o /dev/null --cacert $PKI/ca.crt https://$NODE_IP:$S3_TLS_PORT"
kubectl_admin -n kube-system rollout status deployment/coredns --timeout 90s >/dev/null

log "up in $((SECONDS - started))s; export KUBECONFIG=$KUBECONFIG_ADMIN"
kubectl_admin get nodes -o wide
