#!/usr/bin/env bash
# The PersistentPodState controller at scale on the real control plane, beside the same
# cluster without ipkeep.
#
#   scripts/bench-controller.sh [--statefulsets N] [--replicas M] [--nodes K] [--modes "none full"]
#
# For each mode a fresh cluster (scripts/cluster.sh) with K kwok nodes (default 100) gets N
# StatefulSets (default 1,000) of M pods each (default 10, podManagementPolicy Parallel),
# annotated for auto-generation, created at once:
#   none  no ipkeep (the baseline: how fast this control plane and kwok make the pods Ready);
#   full  ipkeep installed (two controller replicas, webhook and extender; release build).
# Reported per mode: seconds from the create to all pods Ready; with ipkeep, seconds from the
# last pod Ready (its Ready condition's lastTransitionTime) to the last record written (its
# recordedAt; both have a resolution of one second), the peak RSS (VmHWM) of each controller replica, and the API writes per
# pod: PersistentPodState creates, updates and patches (status included) counted by
# kube-apiserver's apiserver_request_total, and the Events the controller published.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
sets=1000
replicas=10
nodes=100
modes="none full"
while [ $# -gt 0 ]; do
  case $1 in
    --statefulsets) sets=${2:?}; shift 2 ;;
    --replicas) replicas=${2:?}; shift 2 ;;
    --nodes) nodes=${2:?}; shift 2 ;;
    --modes) modes=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-controller: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
pods=$((sets * replicas))

state=$(mktemp -d /tmp/ipkeep-bench-controller.XXXXXX)
trap '"$repo/scripts/cluster.sh" down --state "$state/c" >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$repo/scripts/bench-lib.sh"
say() { echo "bench-controller: $*" >&2; }
now_ms() { date +%s%3N; }
bench_report_build

statefulsets() {
  local i
  for ((i = 0; i < sets; i++)); do
    cat <<EOF
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: s$i
  namespace: bench
  annotations:
    ipkeep.dev/auto-generate-persistent-pod-state: "true"
    ipkeep.dev/required-persistent-topology: kubernetes.io/hostname
spec:
  serviceName: s$i
  replicas: $replicas
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: s$i}}
  template:
    metadata:
      labels: {app: s$i}
      annotations: {ipkeep.dev/persistent-pod-state: s$i}
    spec:
      terminationGracePeriodSeconds: 0
      containers: [{name: c, image: localhost/ipkeep/busybox:1.35}]
EOF
  done
}

# Pods whose Ready condition is True, and the latest lastTransitionTime among them (epoch s).
# (RFC 3339 times in UTC sort as text.)
ready() {
  local times n last=0
  times=$($k get pods -n bench --chunk-size=1000 -o jsonpath='{range .items[*]}{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastTransitionTime}{"\n"}{end}{end}' |
    awk '$1 == "True" {print $2}' | sort)
  n=$(grep -c . <<<"$times" || true)
  [ "$n" -gt 0 ] && last=$(date -d "$(tail -1 <<<"$times")" +%s)
  echo "$n $last"
}

recorded() {
  $k get pps -n bench -o jsonpath='{range .items[*]}{.status.recordedPods}{"\n"}{end}' | awk '{n += $1} END {print n + 0}'
}

# kube-apiserver's count of PersistentPodState writes so far.
pps_writes() {
  curl -ksS --cert "$state/c/pki/admin.crt" --key "$state/c/pki/admin.key" "$api/metrics" |
    awk '/^apiserver_request_total\{/ && /resource="persistentpodstates"/ && /verb="(POST|PUT|PATCH|APPLY)"/ {n += $2} END {printf "%d\n", n}'
}

results=()
for mode in $modes; do
  bench_up "$mode"
  api=$($k config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  statefulsets >"$state/sts.yaml"
  writes0=0
  [ "$mode" = none ] || writes0=$(pps_writes)
  say "mode $mode: creating $sets StatefulSets of $replicas pods"
  t0=$(now_ms)
  $k create -f "$state/sts.yaml" >/dev/null
  last_report=0
  while :; do
    read -r n last_ready <<<"$(ready)"
    [ "$n" -ge "$pods" ] && break
    elapsed=$(( ($(now_ms) - t0) / 1000 ))
    if [ "$elapsed" -ge $((last_report + 30)) ]; then
      last_report=$elapsed
      say "mode $mode: $n of $pods pods Ready after ${elapsed} s"
    fi
    [ "$elapsed" -lt 1800 ] || { say "mode $mode: only $n of $pods pods Ready after 30 min; giving up"; exit 1; }
    sleep 5
  done
  ready_ms=$(( last_ready * 1000 - t0 ))
  lag=- rss0=- rss1=- writes=- events=-
  if [ "$mode" != none ]; then
    while [ "$(recorded)" -lt "$pods" ]; do sleep 0.5; done
    # The last record's recordedAt (written by the controller) minus the last Ready transition
    # (written by kwok): both second-resolution timestamps, so polling adds nothing.
    last_record=$($k get pps -n bench -o jsonpath='{range .items[*]}{range .status.podStates.*}{.recordedAt}{"\n"}{end}{end}' | sort | tail -1)
    lag=$(( $(date -d "$last_record" +%s) - last_ready ))
    writes=$(($(pps_writes) - writes0))
    events=$($k get events -n bench --field-selector reportingComponent=ipkeep-controller -o name | wc -l)
    rss() { awk '/^VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$(cat "$state/c/pids/$1")/status"; }
    rss0=$(rss controller-0) rss1=$(rss controller-1)
    say "mode $mode: $writes PersistentPodState writes and $events Events for $pods pods"
  fi
  say "mode $mode: all Ready ${ready_ms} ms after the create; recorded ${lag} s after the last Ready; VmHWM ${rss0} / ${rss1} MiB"
  writes_and_events=-
  [ "$writes" = - ] || writes_and_events=$((writes + events))
  results+=("$mode $ready_ms $lag $rss0 $rss1 $writes_and_events")
  "$repo/scripts/cluster.sh" down --state "$state/c" >/dev/null
done

printf '%s\n' "${results[@]}" | "$report" controller "$sets" "$replicas" "$nodes"
