#!/usr/bin/env bash
# Simulated nodes for scale tests: kwok plays the kubelet for nodes annotated
# kwok.x-k8s.io/node=fake, moving their pods through kwok's stages.
#
# Usage: kwok.sh start|restart   (env below, read at start)
#   KWOK_NODES             simulated nodes to create (default 3)
#   KWOK_POD_DELAY_MS      delay of each pod stage (create, ready, ...; default 500)
#   KWOK_POD_JITTER_MS     random extra delay on top (default 500)
# A pod can set its own with the annotations pod-ready.stage.kwok.x-k8s.io/delay and
# pod-ready.stage.kwok.x-k8s.io/jitter-delay (durations such as "3s"; kwok takes the smaller of
# the two, so a delay longer than the jitter needs both).
# Simulated nodes carry the taint kwok.x-k8s.io/node=fake:NoSchedule and the label
# type=kwok: a workload opts in with a toleration and a node selector. They are in zones
# zone-0, zone-1 and zone-2 (topology.kubernetes.io/zone), in turn.
# shellcheck source=testbed/lib.sh
source "$(dirname "$0")/lib.sh"

KWOK_NODES=${KWOK_NODES:-3}
KWOK_POD_DELAY_MS=${KWOK_POD_DELAY_MS:-500}
KWOK_POD_JITTER_MS=${KWOK_POD_JITTER_MS:-500}
KWOK_DIR=$TB/kwok

stages_dir() { echo "$(cd "$TESTBED_SRC/gomod/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"; }

write_config() {
  local stages
  stages=$(stages_dir)
  mkdir -p "$KWOK_DIR"
  {
    cat <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: 10.245.0.0/16
  nodeIP: 10.245.255.254
  manageAllNodes: false
  manageNodesWithAnnotationSelector: kwok.x-k8s.io/node=fake
  nodeLeaseDurationSeconds: 40
  nodeLeaseParallelism: 4
  podPlayStageParallelism: 8
  nodePlayStageParallelism: 4
EOF
    for stage in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
      pod/general/pod-{create,init-container-running,init-container-completed,ready,complete,delete}.yaml; do
      echo "---"
      sed -e "s/durationMilliseconds: 1000/durationMilliseconds: $KWOK_POD_DELAY_MS/" \
        -e "s/jitterDurationMilliseconds: 5000/jitterDurationMilliseconds: $KWOK_POD_JITTER_MS/" \
        "$stages/$stage"
    done
  } >"$KWOK_DIR/kwok.yaml"
}

create_nodes() {
  local i
  for ((i = 0; i < KWOK_NODES; i++)); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: {node.alpha.kubernetes.io/ttl: "0", kwok.x-k8s.io/node: fake}
  labels:
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: kwok-node-$i
    topology.kubernetes.io/zone: zone-$((i % 3))
    type: kwok
spec:
  taints: [{key: kwok.x-k8s.io/node, value: fake, effect: NoSchedule}]
EOF
  done | kubectl_admin apply -f - >/dev/null
}

start() {
  write_config
  setsid "$KWOK_BIN/kwok" --config "$KWOK_DIR/kwok.yaml" --kubeconfig "$KUBECONFIG_ADMIN" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --server-address 127.0.0.1:10247 </dev/null >"$TB/logs/kwok.log" 2>&1 &
  echo $! >"$TB/pids/kwok.pid"
  create_nodes
  wait_for 60 "$KWOK_NODES kwok nodes Ready" bash -c \
    "[[ \$('$KUBECTL' --kubeconfig '$KUBECONFIG_ADMIN' get nodes -l type=kwok -o 'jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}' | grep -c True) -ge $KWOK_NODES ]]"
}

stop() {
  [[ -f $TB/pids/kwok.pid ]] || return 0
  kill "$(cat "$TB/pids/kwok.pid")" 2>/dev/null || true
  rm -f "$TB/pids/kwok.pid"
}

case ${1:-} in
  start) start ;;
  restart)
    stop
    start
    ;;
  *) die "usage: kwok.sh start|restart" ;;
esac
