#!/usr/bin/env bash
# Stops the test bed and removes everything it made on the host: processes, containers,
# mounts, network namespaces, the bridge, iptables rules and ipsets, cgroups and sysctl changes.
# It works from what the host shows, not from this checkout's files, so it also cleans
# up after a run that was killed in another clone. Idempotent. Caches are kept.
# shellcheck source=testbed/lib.sh
source "$(dirname "$0")/lib.sh"

quiet=false
[[ ${1:-} == --quiet ]] && quiet=true
say() { $quiet || log "$@"; }

# pids_of PATTERN: processes whose command line matches (never this script's own).
pids_of() { pgrep -f "$1" | grep -vx "$$" || true; }

stop_pids() {
  local pids=("$@")
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "${pids[@]}" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

# 1. Our programs: everything run from the binary cache, and kwok's.
mapfile -t daemons < <(pids_of "^$CACHE/bin/"; pids_of "testbed/local_volumes.py --kubeconfig")
if ((${#daemons[@]})); then
  say "stopping ${#daemons[@]} test bed processes"
  stop_pids "${daemons[@]}"
fi

# 2. Containers: through containerd. A killed run leaves them in containerd's metadata
#    with nobody serving it, so start containerd again just to remove them.
if [[ -f $RUN/containerd.toml ]] && ! timeout 5 "${CTR[@]}" version >/dev/null 2>&1; then
  setsid containerd --config "$RUN/containerd.toml" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 50); do
    timeout 2 "${CTR[@]}" version >/dev/null 2>&1 && break
    sleep 0.2
  done
fi
if [[ -S $CONTAINERD_SOCK ]] && timeout 5 "${CTR[@]}" version >/dev/null 2>&1; then
  mapfile -t tasks < <("${CTR[@]}" tasks ls -q 2>/dev/null || true)
  ((${#tasks[@]})) && say "removing ${#tasks[@]} containers"
  for task in "${tasks[@]}"; do
    "${CTR[@]}" tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
  done
  for task in "${tasks[@]}"; do
    for _ in $(seq 20); do
      "${CTR[@]}" tasks delete "$task" >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
  mapfile -t containers < <("${CTR[@]}" containers ls -q 2>/dev/null || true)
  for container in "${containers[@]}"; do
    "${CTR[@]}" containers delete "$container" >/dev/null 2>&1 || true
  done
fi
mapfile -t runtime < <(pids_of "containerd --config $RUN/containerd.toml"; pids_of "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK")
stop_pids "${runtime[@]}"

# Anything still in the pods' cgroups (a shim killed without its children).
for controller in /sys/fs/cgroup/*/; do
  [[ -d $controller/kubepods ]] || continue
  leftover=$(find "$controller/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null || true)
  # shellcheck disable=SC2086 # a list of pids
  if [[ -n $leftover ]]; then kill -KILL $leftover 2>/dev/null || true; fi
done
sleep 0.2
for controller in /sys/fs/cgroup/*/; do
  for top in kubepods kubepods.slice; do
    if [[ -d $controller/$top ]]; then find "$controller/$top" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
done

# 3. Mounts under our state (pod volumes, container rootfs, netns handles, an image
#    build's chroot), deepest first.
mount_points() {
  awk '{print $2}' /proc/self/mounts | sed 's/\\040/ /g' |
    grep -E "^($RUN|$CACHE/|/run/netns/cni-|/var/run/netns/cni-|.*/\.testbed/)" | sort -r || true
}
mapfile -t mounts < <(mount_points)
((${#mounts[@]})) && say "unmounting ${#mounts[@]} mounts"
for m in "${mounts[@]}"; do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
done

# 4. Network: pod namespaces (their veths go with them), the bridge, iptables rules.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^cni-' || true); do
  ip netns delete "$ns" 2>/dev/null || true
done
# The self bind-mount that network namespace handles live on, once it holds none.
if mountpoint -q /run/netns && [[ -z $(ls -A /run/netns 2>/dev/null) ]]; then umount /run/netns || true; fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE"; fi
for family in iptables ip6tables iptables-legacy ip6tables-legacy; do
  command -v "$family-save" >/dev/null || continue
  rules=$("$family-save" 2>/dev/null || true) # captured: grep -q would cut the pipe short
  if grep -qE 'KUBE-|CNI-|statefleet-testbed' <<<"$rules"; then
    say "removing $family rules of kube-proxy, kube-router, the kubelet, CNI and up.sh"
    grep -vE 'KUBE-|CNI-|statefleet-testbed' <<<"$rules" | "$family-restore"
  fi
done
# kube-router's ipsets (pod addresses; its TMP- sets are left by a swap it did not finish), once
# no rule refers to them.
if command -v ipset >/dev/null; then
  mapfile -t sets < <(ipset list -n 2>/dev/null | grep -E '^(inet6:)?(KUBE-SRC-|KUBE-DST-|TMP-)[A-Z2-7]{16}$' || true)
  ((${#sets[@]})) && say "removing ${#sets[@]} ipsets of kube-router"
  for set in "${sets[@]}"; do
    ipset destroy "$set" 2>/dev/null || true
  done
fi
if command -v conntrack >/dev/null; then
  conntrack -D -d "${SERVICE_CIDR%/*}" --mask-dst 255.255.0.0 >/dev/null 2>&1 || true
fi

# 5. Kernel settings the kubelet or the test bed changed, back to what they were.
if [[ -f $RUN/sysctl.saved ]]; then
  while IFS= read -r setting; do
    sysctl -qw "$setting" 2>/dev/null || true
  done <"$RUN/sysctl.saved"
fi

# 6. Runtime state. Caches (binaries, images, containerd's content) stay.
rm -rf "$RUN"
# Volumes go with the cluster that held their claims.
rm -rf "$TB/etcd" "$TB/kubelet" "$TB/pids" "$TB/pki" "$TB/cni" "$TB/kwok" "$TB/volumes" "$TB/s3"
[[ -d $CACHE/containerd/root ]] && rm -rf "$CACHE/containerd/root/io.containerd.runtime.v2.task"
say "down"
