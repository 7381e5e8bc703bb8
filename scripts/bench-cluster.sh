#!/usr/bin/env bash
# kube-scheduler throughput on the real control plane, with and without ipkeep.
#
#   scripts/bench-cluster.sh [--pods N] [--nodes M] [--modes "none webhook full"] [--pin-cpus A:B]
#
# For each mode it starts a fresh cluster (scripts/cluster.sh) with M kwok nodes (default 500):
#   none     no ipkeep at all (the baseline);
#   webhook  ipkeep installed, kube-scheduler without the extender;
#   full     ipkeep installed, kube-scheduler calling the extender.
# ipkeep runs its release build (scripts/cluster.sh --release).
# Then a StatefulSet of N pods (default 1,000, podManagementPolicy Parallel) with a
# PersistentPodState is created, and timed until kube-scheduler has bound all N ("create");
# once every pod is recorded, all its pods are deleted at once and the StatefulSet controller
# re-creates them, through the webhook and pinned to their recorded nodes when ipkeep runs,
# timed again until all are bound ("rebuild"). Throughput is N over the wall time of a wave,
# which covers pod creation (admission included) and scheduling (extender calls included).
# kube-scheduler's own per-attempt latency (scheduler_scheduling_attempt_duration_seconds,
# which includes its calls to the extender) is read from its /metrics before and after each
# wave. Prints one table, with each mode's ratio to the baseline of the same run.
# --pin-cpus A:B (scripts/cluster.sh) runs the control plane on CPUs A and ipkeep on CPUs B in
# every mode, the baseline included: ipkeep's cost without its own CPU time competing with the
# control plane's, as where ipkeep runs on worker nodes.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
pods=1000
nodes=500
modes="none webhook full"
pin_cpus=
while [ $# -gt 0 ]; do
  case $1 in
    --pods) pods=${2:?}; shift 2 ;;
    --nodes) nodes=${2:?}; shift 2 ;;
    --modes) modes=${2:?}; shift 2 ;;
    --pin-cpus) pin_cpus=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-cluster: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done

# The script's own kubectl and curl run beside ipkeep, not on the control plane's CPUs.
[ -n "$pin_cpus" ] && taskset -cp "${pin_cpus##*:}" $$ >/dev/null
state=$(mktemp -d /tmp/ipkeep-bench-cluster.XXXXXX)
trap '"$repo/scripts/cluster.sh" down --state "$state/c" >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"
say() { echo "bench-cluster: $*" >&2; }
bench_report_build

# Observations and p50 / p99 (ms) of the scheduler's attempt-duration histogram between two
# scrapes (files): "count p50 p99".
attempts() {
  "$report" histogram scheduler_scheduling_attempt_duration_seconds "$1" "$2" \
    --label result=scheduled --quantiles 0.5,0.99 --scale 1000
}

# How many pods kube-scheduler has bound so far (its scheduler_schedule_attempts_total with
# result "scheduled"): read from its own /metrics, so polling loads neither the apiserver nor
# etcd.
scheduled() {
  scrape "$state/poll"
  awk '/^scheduler_schedule_attempts_total\{.*result="scheduled"/ {n += $2} END {printf "%d\n", n}' "$state/poll"
}

# Milliseconds from $2 (date +%s%N) until kube-scheduler has bound $1 pods in all.
wave() {
  local target=$1 t0=$2
  while [ "$(scheduled)" -lt "$target" ]; do sleep 0.2; done
  echo "$(( ($(date +%s%N) - t0) / 1000000 ))"
}

results=()
for mode in $modes; do
  bench_up "$mode"
  port_sched=$(grep -o -- '--secure-port=[0-9]*' <(tr '\0' ' ' </proc/"$(cat "$state/c/pids/kube-scheduler")"/cmdline) | cut -d= -f2)
  scrape() { curl -ksS --cert "$state/c/pki/admin.crt" --key "$state/c/pki/admin.key" "https://127.0.0.1:$port_sched/metrics" >"$1"; }
  if [ "$mode" != none ]; then
    $k apply -f - >/dev/null <<EOF
apiVersion: ipkeep.dev/v1alpha1
kind: PersistentPodState
metadata: {name: bench, namespace: bench}
spec:
  targetRef: {apiVersion: apps/v1, kind: StatefulSet, name: bench}
  requiredPersistentTopology: {nodeTopologyKeys: [kubernetes.io/hostname]}
  preferredPersistentTopology:
    - weight: 50
      preference: {nodeTopologyKeys: [topology.kubernetes.io/zone]}
EOF
  fi
  scrape "$state/m0"
  base=$(scheduled)
  t0=$(date +%s%N)
  $k apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: bench, namespace: bench}
spec:
  serviceName: bench
  replicas: $pods
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: bench}}
  template:
    metadata:
      labels: {app: bench}
      annotations: {ipkeep.dev/persistent-pod-state: bench}
    spec:
      terminationGracePeriodSeconds: 0
      containers: [{name: c, image: localhost/ipkeep/busybox:1.35}]
EOF
  create=$(wave $((base + pods)) "$t0")
  scrape "$state/m1"
  if [ "$mode" != none ]; then
    # The records must be complete before the rebuild, or some pods come back unpinned.
    # kwok marks pods Ready slowly under load; give up on the rebuild after 3 minutes.
    for ((i = 0; i < 90; i++)); do
      [ "$($k -n bench get pps bench -o jsonpath='{.status.recordedPods}')" = "$pods" ] && break
      sleep 2
    done
    [ "$i" -lt 90 ] || say "mode $mode: only $($k -n bench get pps bench -o jsonpath='{.status.recordedPods}') of $pods pods recorded after 180 s (kwok has not marked the rest Ready); the rebuild wave runs anyway, partly unpinned"
  fi
  base=$(scheduled)
  t0=$(date +%s%N)
  $k -n bench delete pods -l app=bench --wait=false >/dev/null
  rebuild=$(wave $((base + pods)) "$t0")
  scrape "$state/m2"
  read -r n1 p50c p99c <<<"$(attempts "$state/m0" "$state/m1")"
  read -r n2 p50r p99r <<<"$(attempts "$state/m1" "$state/m2")"
  say "mode $mode: create ${create} ms (${n1} attempts, p50 ${p50c} ms, p99 ${p99c} ms), rebuild ${rebuild} ms (${n2} attempts, p50 ${p50r} ms, p99 ${p99r} ms)"
  results+=("$mode $create $rebuild $p50c $p99c $p50r $p99r")
  "$repo/scripts/cluster.sh" down --state "$state/c" >/dev/null
done

printf '%s\n' "${results[@]}" | "$report" cluster "$pods" "$nodes"
