#!/usr/bin/env bash
# kube-scheduler throughput on the real control plane, with and without ipkeep.
#
#   scripts/bench-cluster.sh [--shapes "1x1000 200x5 1x10"] [--nodes M]
#                            [--modes "none webhook policy full policy-full noop"]
#                            [--pin-cpus A:B] [--k8s-version V] [--keep-metrics DIR]
#                            [--port-base P] [--pods N] [--cold] [--stop-controller-in-create]
#
# For each mode it starts a fresh cluster (scripts/cluster.sh) with M kwok nodes (default 500):
#   none         no ipkeep at all (the baseline);
#   noop         ipkeep installed with its mutating webhook, and StatefulSets without a
#                PersistentPodState: the webhook is called for every pod and returns no patch
#                (the same server, TLS and path, without a decision to apply): the cost of a
#                mutating webhook as such;
#   webhook      ipkeep installed, new pods pinned by the mutating webhook (--admission webhook),
#                kube-scheduler without the extender;
#   policy       ipkeep installed, new pods pinned by the admission policy ipkeep-pin inside
#                kube-apiserver (--admission policy: Kubernetes 1.36 and later), no extender;
#   full         webhook + the extender in kube-scheduler;
#   policy-full  policy + the extender.
# ipkeep runs its release build (scripts/cluster.sh --release).
# Then, for each shape SxR (--shapes; default "1x1000", --pods N is "1xN"), S StatefulSets of R
# pods each (podManagementPolicy Parallel) in one namespace, each with a PersistentPodState
# (not in modes none and noop; applied just before the wave), are created together and timed
# until kube-scheduler has bound all S*R ("create"); once every pod is recorded, all of them are deleted at once and the
# StatefulSet controller re-creates them, through the webhook or the policy and pinned to their
# recorded nodes when ipkeep runs, timed again until all are bound ("rebuild"); then the
# namespace is emptied for the next shape. Throughput is N over the wall time
# of a wave, which covers pod creation (admission included) and scheduling (extender calls
# included). kube-scheduler's own per-attempt latency (scheduler_scheduling_attempt_duration_seconds,
# which includes its calls to the extender) is read from its /metrics before and after each
# wave, and so is kube-apiserver's admission time from its /metrics: the mutating admission
# step of every CREATE in the wave (apiserver_admission_step_admission_duration_seconds, p50 /
# p99 bucket bounds and the mean), and ipkeep's own mutation, the pin webhook's calls
# (apiserver_admission_webhook_admission_duration_seconds) or the policy's evaluations
# (apiserver_mutating_admission_policy_check_duration_seconds): count and mean. Prints one
# table per shape, with each mode's ratio to the baseline of the same run. With ipkeep, after
# the rebuild wave (every pod recorded) it also prints the PersistentPodStates' and the
# admission plan's sizes (the compact JSON the API server stores) and how many re-created pods
# carry ipkeep.dev/pinned-by, a nodeSelector with their recorded node, and run on it.
# --pin-cpus A:B (scripts/cluster.sh) runs the control plane on CPUs A and ipkeep on CPUs B in
# every mode, the baseline included: ipkeep's cost without its own CPU time competing with the
# control plane's, as where ipkeep runs on worker nodes. --k8s-version V is scripts/cluster.sh's
# (the policy modes need 1.36 or later). --keep-metrics DIR keeps every scrape (DIR/MODE/
# SHAPE/apiserver-0..2.txt, scheduler-0..2.txt: before create, after create, after rebuild).
# --port-base P is scripts/cluster.sh's (default its own): the clusters' ports, P to P+10, for a
# run beside another cluster.
# Before the first wave, every mode's fresh cluster runs a warm-up: one StatefulSet of one pod
# (with a PersistentPodState where the mode has ipkeep) in namespace bench-warmup, created,
# recorded, and its pod deleted and re-created, so kube-apiserver has admitted a pinned pod once.
# A kube-apiserver that has never run a MutatingAdmissionPolicy on pods fetches and parses its
# own OpenAPI schema of core/v1 on the first evaluation, once per concurrent request until one
# has finished (1.37.2: no static type converter, no single flight): a burst of pod CREATEs right
# after it starts pays seconds each (docs/benchmarks.md, "The policy's first burst after
# kube-apiserver starts"). --cold skips the warm-up, to measure that burst.
# Where ipkeep runs, each wave also logs the CPU time (ms) each ipkeep process used in it, and
# scheduler-ext's own time per mutate-pods request (its ipkeep_scheduler_ext_request_duration_
# seconds: from the request's last body byte to its response), against kube-apiserver's view of
# the same calls above. --stop-controller-in-create (a diagnostic) stops both ipkeep-controller
# replicas (SIGSTOP) for the create wave and resumes them after it: what the wave costs when
# nothing records the new pods meanwhile (the rebuild needs the records, so it is not stopped).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
shapes="1x1000"
nodes=500
modes="none webhook policy full policy-full"
pin_cpus=
k8s_version=
keep_metrics=
port_base=
cold=no
stop_controller=no
while [ $# -gt 0 ]; do
  case $1 in
    --pods) shapes="1x${2:?}"; shift 2 ;;
    --shapes) shapes=${2:?}; shift 2 ;;
    --nodes) nodes=${2:?}; shift 2 ;;
    --modes) modes=${2:?}; shift 2 ;;
    --pin-cpus) pin_cpus=${2:?}; shift 2 ;;
    --k8s-version) k8s_version=${2:?}; shift 2 ;;
    --keep-metrics) keep_metrics=${2:?}; shift 2 ;;
    --port-base) port_base=${2:?}; shift 2 ;;
    --cold) cold=yes; shift ;;
    --stop-controller-in-create) stop_controller=yes; shift ;;
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

# kube-apiserver's mutating admission step of every CREATE between two scrapes (files), in ms:
# "p50/p99/mean".
admit() {
  "$report" histogram apiserver_admission_step_admission_duration_seconds "$1" "$2" \
    --label type=admit --label operation=CREATE --scale 1000 --mean | awk '{print $2 "/" $3 "/" $4}'
}

# ipkeep's own mutation between two scrapes: the pin webhook's calls or the policy ipkeep-pin's
# evaluations, "count/mean ms"; - without ipkeep.
mutation() {
  local metric label
  case $mode in
    none) echo -; return ;;
    webhook|full|noop) metric=apiserver_admission_webhook_admission_duration_seconds label=name=pin.ipkeep.dev ;;
    *) metric=apiserver_mutating_admission_policy_check_duration_seconds label=policy=ipkeep-pin ;;
  esac
  "$report" histogram "$metric" "$1" "$2" --label "$label" --quantiles 0.5 --scale 1000 --mean |
    awk '{print $1 "/" $3}'
}

# What else kube-apiserver's admission spent between two scrapes, for the log: the mutating
# plugins MutatingAdmissionPolicy and MutatingAdmissionWebhook on CREATEs, the validating step
# on DELETEs (the lifecycle webhook), and CEL evaluations ("count p99 mean", ms).
admission_detail() {
  local m
  for m in "controller_admission_duration_seconds --label name=MutatingAdmissionPolicy --label type=admit --label operation=CREATE" \
    "controller_admission_duration_seconds --label name=MutatingAdmissionWebhook --label type=admit --label operation=CREATE" \
    "step_admission_duration_seconds --label type=validate --label operation=DELETE"; do
    # shellcheck disable=SC2086 # the labels, split on purpose
    printf '%s: %s; ' "${m// --label /,}" \
      "$("$report" histogram "apiserver_admission_${m%% *}" "$1" "$2" ${m#* } --quantiles 0.99 --scale 1000 --mean)"
  done
  printf 'cel_evaluation: %s\n' "$("$report" histogram apiserver_cel_evaluation_duration_seconds "$1" "$2" --quantiles 0.99 --scale 1000 --mean)"
}

# With ipkeep, after the rebuild: the PersistentPodStates' and the admission plan's sizes, and
# whether the re-created pods are pinned to their recorded nodes (the policy writes
# spec.nodeSelector, the webhook node affinity; both the annotation ipkeep.dev/pinned-by).
records() {
  $k -n bench get pps -o json >"$state/pps.json"
  $k -n bench get pods -l wave=bench -o json >"$state/pods.json"
  $k -n bench get configmap ipkeep-admission-plan -o json >"$state/plan.json" 2>/dev/null || echo '{}' >"$state/plan.json"
  python3 - "$state/pps.json" "$state/pods.json" "$state/plan.json" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["items"]
compact = lambda v: len(json.dumps(v, separators=(",", ":")).encode())
states = {}
for pps in items:
    states.update(pps.get("status", {}).get("podStates", {}))
plan = json.load(open(sys.argv[3]))
pods = [p for p in json.load(open(sys.argv[2]))["items"] if not p["metadata"].get("deletionTimestamp")]
node = lambda p: states.get(p["metadata"]["name"], {}).get("nodeName")
by = sum("ipkeep.dev/pinned-by" in p["metadata"].get("annotations", {}) for p in pods)
sel = sum(p["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname") == node(p) for p in pods)
on = sum(p["spec"].get("nodeName") == node(p) for p in pods)
biggest = max((compact(p) for p in items), default=0)
print(f"{len(items)} PersistentPodStates with {len(states)} records: {sum(compact(p) for p in items)} bytes "
      f"compact in all, the largest {biggest} ({biggest * 100 / (1.5 * 1024 * 1024):.1f} % of etcd's 1.5 MiB request limit); "
      f"admission plan {len(plan.get('data', {}))} entries, {sum(len(k) + len(v) for k, v in plan.get('data', {}).items())} bytes of entries; "
      f"{len(pods)} re-created pods: {by} with ipkeep.dev/pinned-by, {sel} with nodeSelector = recorded node, {on} bound to it")
PY
}

# CPU time (ms, user + system) of each ipkeep process so far, "name=ms ...", from /proc; empty
# without ipkeep.
ipkeep_cpu() {
  local f pid
  for f in "$state"/c/pids/scheduler-ext "$state"/c/pids/controller-*; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    # Fields 14 and 15 of /proc/PID/stat, after the command name in parentheses.
    awk -v n="$(basename "$f")" -v hz="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); printf "%s=%d ", n, ($12 + $13) * 1000 / hz}' "/proc/$pid/stat" 2>/dev/null || true
  done
}

# The CPU ms each ipkeep process used between two ipkeep_cpu readings.
cpu_delta() {
  python3 -c '
import sys
a = dict(kv.split("=") for kv in sys.argv[1].split())
b = dict(kv.split("=") for kv in sys.argv[2].split())
print(" ".join(f"{k} {int(b[k]) - int(a.get(k, 0))}" for k in b) or "-")' "$1" "$2"
}

# scheduler-ext's /metrics into $1 (empty without ipkeep).
escrape() {
  local probe
  probe=$(sed -n 's/^IPKEEP_EXT_PROBE=//p' "$state/c/ipkeep.env" 2>/dev/null || true)
  if [ -n "$probe" ]; then curl -fsS "$probe/metrics" >"$1" 2>/dev/null || : >"$1"; else : >"$1"; fi
}

# scheduler-ext's own time per mutate-pods request between two scrapes: "count/mean ms".
ext_time() {
  [ -s "$1" ] && [ -s "$2" ] || { echo -; return; }
  "$report" histogram ipkeep_scheduler_ext_request_duration_seconds "$1" "$2" --label endpoint=mutate-pods \
    --quantiles 0.5 --scale 1000 --mean | awk '{print $1 "/" $3}'
}

# The StatefulSets of shape $1 (SxR) as YAML, each with a PersistentPodState when $2 is yes
# ("only": the PersistentPodStates alone).
statefulsets() {
  local n=${1%x*} r=${1#*x} with_pps=$2 i
  for ((i = 0; i < n; i++)); do
    if [ "$with_pps" != no ]; then
      cat <<EOF
---
apiVersion: ipkeep.dev/v1alpha1
kind: PersistentPodState
metadata: {name: bench-$i, namespace: bench}
spec:
  targetRef: {apiVersion: apps/v1, kind: StatefulSet, name: bench-$i}
  requiredPersistentTopology: {nodeTopologyKeys: [kubernetes.io/hostname]}
  preferredPersistentTopology:
    - weight: 50
      preference: {nodeTopologyKeys: [topology.kubernetes.io/zone]}
EOF
    fi
    [ "$with_pps" = only ] && continue
    cat <<EOF
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: bench-$i, namespace: bench}
spec:
  serviceName: bench
  replicas: $r
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: bench-$i}}
  template:
    metadata:
      labels: {app: bench-$i, wave: bench}
    spec:
      terminationGracePeriodSeconds: 0
      containers: [{name: c, image: localhost/ipkeep/busybox:1.35}]
EOF
  done
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

# The warm-up of the header: one pod created, recorded (with ipkeep), deleted and re-created.
warm_up() {
  local with_pps=$1 i
  $k create namespace bench-warmup >/dev/null
  statefulsets 1x1 "$with_pps" | sed 's/namespace: bench}/namespace: bench-warmup}/; s/bench-0/warmup/g' |
    $k apply -f - >/dev/null
  bound() { $k -n bench-warmup get pod warmup-0 -o jsonpath='{.metadata.uid} {.spec.nodeName}' 2>/dev/null; }
  for ((i = 0; i < 150; i++)); do [ -n "$(bound | cut -sd' ' -f2)" ] && break; sleep 0.2; done
  if [ "$with_pps" = yes ]; then
    for ((i = 0; i < 150; i++)); do
      [ "$($k -n bench-warmup get pps warmup -o jsonpath='{.status.recordedPods}')" = 1 ] &&
        $k -n bench-warmup get configmap ipkeep-admission-plan >/dev/null 2>&1 && break
      sleep 0.2
    done
    sleep 2
  fi
  local uid
  uid=$(bound | cut -d' ' -f1)
  $k -n bench-warmup delete pod warmup-0 --wait=false >/dev/null
  for ((i = 0; i < 150; i++)); do
    local now; now=$(bound)
    [ -n "$now" ] && [ "${now%% *}" != "$uid" ] && [ -n "$(echo "$now" | cut -sd' ' -f2)" ] && return
    sleep 0.2
  done
  say "mode $mode: the warm-up pod was not re-created and bound within 30 s; the waves run anyway"
}

for shape in $shapes; do
  [[ $shape =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || { say "a shape is SxR (StatefulSets x replicas), got '$shape'"; exit 1; }
done
for mode in $modes; do
  bench_up "$mode"
  port_sched=$(grep -o -- '--secure-port=[0-9]*' <(tr '\0' ' ' </proc/"$(cat "$state/c/pids/kube-scheduler")"/cmdline) | cut -d= -f2)
  scrape() { curl -ksS --cert "$state/c/pki/admin.crt" --key "$state/c/pki/admin.key" "https://127.0.0.1:$port_sched/metrics" >"$1"; }
  ascrape() { $k get --raw /metrics >"$1"; }
  with_pps=yes
  case $mode in none|noop) with_pps=no ;; esac
  [ "$cold" = yes ] || warm_up "$with_pps"
  for shape in $shapes; do
    pods=$(( ${shape%x*} * ${shape#*x} ))
    statefulsets "$shape" no >"$state/workload.yaml"
    # The PersistentPodStates exist before the wave, so every mode's wave creates the same
    # objects: kubectl applies a file's objects one after another, and 200 more of them
    # delayed the last StatefulSets by seconds.
    [ "$with_pps" = yes ] && statefulsets "$shape" only | $k apply -f - >/dev/null
    scrape "$state/m0"
    ascrape "$state/a0"
    escrape "$state/e0"
    cpu0=$(ipkeep_cpu)
    if [ "$stop_controller" = yes ]; then
      for f in "$state"/c/pids/controller-*; do kill -STOP "$(cat "$f")"; done
    fi
    base=$(scheduled)
    t0=$(date +%s%N)
    $k apply -f "$state/workload.yaml" >/dev/null
    create=$(wave $((base + pods)) "$t0")
    scrape "$state/m1"
    ascrape "$state/a1"
    escrape "$state/e1"
    cpu1=$(ipkeep_cpu)
    if [ "$stop_controller" = yes ]; then
      for f in "$state"/c/pids/controller-*; do kill -CONT "$(cat "$f")"; done
    fi
    if [ "$with_pps" = yes ]; then
      # The records must be complete before the rebuild, or some pods come back unpinned.
      # kwok marks pods Ready slowly under load; give up on the rebuild after 3 minutes.
      recorded() { $k -n bench get pps -o jsonpath='{range .items[*]}{.status.recordedPods}{"\n"}{end}' | awk '{n += $1} END {print n + 0}'; }
      for ((i = 0; i < 90; i++)); do
        [ "$(recorded)" = "$pods" ] && break
        sleep 2
      done
      [ "$i" -lt 90 ] || say "mode $mode, $shape: only $(recorded) of $pods pods recorded after 180 s (kwok has not marked the rest Ready); the rebuild wave runs anyway, partly unpinned"
      # The plan is written right after the records; let it reach kube-apiserver's informer.
      sleep 2
    fi
    base=$(scheduled)
    t0=$(date +%s%N)
    $k -n bench delete pods -l wave=bench --wait=false >/dev/null
    rebuild=$(wave $((base + pods)) "$t0")
    scrape "$state/m2"
    ascrape "$state/a2"
    escrape "$state/e2"
    cpu2=$(ipkeep_cpu)
    read -r n1 p50c p99c <<<"$(attempts "$state/m0" "$state/m1")"
    read -r n2 p50r p99r <<<"$(attempts "$state/m1" "$state/m2")"
    admit_c=$(admit "$state/a0" "$state/a1") admit_r=$(admit "$state/a1" "$state/a2")
    mut_c=$(mutation "$state/a0" "$state/a1") mut_r=$(mutation "$state/a1" "$state/a2")
    say "mode $mode, $shape: create ${create} ms (${n1} attempts, p50 ${p50c} ms, p99 ${p99c} ms; mutating admission p50/p99/mean ${admit_c} ms, ipkeep's mutation calls/mean ${mut_c} ms), rebuild ${rebuild} ms (${n2} attempts, p50 ${p50r} ms, p99 ${p99r} ms; mutating admission ${admit_r} ms, ipkeep's mutation ${mut_r} ms)"
    say "mode $mode, $shape: create admission: $(admission_detail "$state/a0" "$state/a1")"
    say "mode $mode, $shape: rebuild admission: $(admission_detail "$state/a1" "$state/a2")"
    if [ "$mode" != none ]; then
      say "mode $mode, $shape: ipkeep's CPU ms in the create wave: $(cpu_delta "$cpu0" "$cpu1"); in the rebuild wave: $(cpu_delta "$cpu1" "$cpu2")"
      say "mode $mode, $shape: scheduler-ext's own time per mutate-pods request, count/mean ms: create $(ext_time "$state/e0" "$state/e1"), rebuild $(ext_time "$state/e1" "$state/e2")"
    fi
    if [ "$with_pps" = yes ]; then say "mode $mode, $shape: $(records)"; fi
    if [ -n "$keep_metrics" ]; then
      mkdir -p "$keep_metrics/$mode/$shape"
      for i in 0 1 2; do
        cp "$state/a$i" "$keep_metrics/$mode/$shape/apiserver-$i.txt"
        cp "$state/m$i" "$keep_metrics/$mode/$shape/scheduler-$i.txt"
        cp "$state/e$i" "$keep_metrics/$mode/$shape/scheduler-ext-$i.txt"
      done
      if [ "$with_pps" = yes ]; then cp "$state/pps.json" "$state/pods.json" "$state/plan.json" "$keep_metrics/$mode/$shape/"; fi
    fi
    echo "$mode $create $rebuild $p50c $p99c $p50r $p99r $admit_c $admit_r $mut_c $mut_r" >>"$state/results-$shape"
    # Empty the namespace for the next shape: StatefulSets, their pods, PersistentPodStates
    # (and with them the admission plan).
    $k -n bench delete statefulsets --all --wait=true >/dev/null
    $k -n bench delete pods --all --grace-period=0 --force --wait=true >/dev/null 2>&1 || true
    if [ "$with_pps" = yes ]; then $k -n bench delete pps --all --wait=true >/dev/null; fi
  done
  "$repo/scripts/cluster.sh" down --state "$state/c" >/dev/null
done

for shape in $shapes; do
  echo
  echo "Shape $shape: ${shape%x*} StatefulSet(s) of ${shape#*x} in one namespace"
  "$report" cluster "$(( ${shape%x*} * ${shape#*x} ))" "$nodes" <"$state/results-$shape"
done
