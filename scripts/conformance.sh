#!/usr/bin/env bash
# Runs Kubernetes' own conformance tests on the test cluster's real nodes with ipkeep managing every
# StatefulSet the tests create, and prints the results.
#
#   scripts/conformance.sh [--state DIR] [--focus REGEX] [--skip REGEX] [--out DIR]
#                          [--k8s-version V] [--keep-logs] [-- UP-OPTIONS...]
#
# The tests (default --focus): `[sig-apps] StatefulSet ... [Conformance]` and `[sig-network]
# Networking Granular Checks: Pods ... [Conformance]`, from e2e.test of the cluster's Kubernetes
# release (scripts/e2e-build.sh builds it and agnhost from k8s.io/kubernetes; cached).
#
# The cluster: the one running in --state DIR (default $IPKEEP_CLUSTER_STATE or /tmp/ipkeep-cluster);
# if none runs there, this script brings one up with `scripts/cluster.sh up --state DIR
# UP-OPTIONS...` (root; hold /tmp/ipkeep-real-nodes.lock) and takes it down at the end (with
# --keep-logs, DIR/logs stays).
#
# The images: the nodes have no registry, so the images the tests pull (agnhost, busybox, pause
# under their registry.k8s.io names, as `e2e.test --list-images` prints them) are built by
# scripts/e2e-images.py and imported into every node's containerd.
#
# ipkeep's part: e2e.test creates each test's namespace itself, with a random name; our build of it
# (tests/k8s/tools/e2e/VERSION/e2e_test.go) labels every one with
# ipkeep.dev/auto-generate-persistent-pod-state=true right after creating it, before the test's own
# set-up, so ipkeep's controller generates a PersistentPodState for every StatefulSet the tests
# create. During the run, watches record every PersistentPodState and every pod a StatefulSet owns;
# the summary counts the PersistentPodStates generated and, for each StatefulSet pod rebuilt (a
# new pod of the same name), whether it came back on the same node with the same IP.
#
# Results go in --out DIR (default DIR/conformance, or /tmp/ipkeep-conformance when the cluster is
# brought up here): junit.xml, e2e.log, pods.log, pps.log, summary.txt. Exit status: 0 if every
# test that ran passed.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
state=${IPKEEP_CLUSTER_STATE:-/tmp/ipkeep-cluster}
focus='\[sig-apps\] StatefulSet.*\[Conformance\]|\[sig-network\] Networking Granular Checks: Pods.*\[Conformance\]'
skip=''
out=''
k8s=''
keep_logs=0
up_args=()
label=ipkeep.dev/auto-generate-persistent-pod-state=true

say() { echo "conformance: $*" >&2; }
die() { say "error: $*"; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --state) state=${2:?--state needs a directory}; shift 2 ;;
    --focus) focus=${2:?--focus needs a regular expression}; shift 2 ;;
    --skip) skip=${2:?--skip needs a regular expression}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --k8s-version) k8s=${2:?--k8s-version needs a release such as v1.37.2}; shift 2 ;;
    --keep-logs) keep_logs=1; shift ;;
    --) shift; up_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
state=$(realpath -m "$state")

brought_up=0
pids=()
# shellcheck disable=SC2329  # run by the EXIT trap
finish() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "$brought_up" = 1 ]; then
    say "taking the cluster down"
    local keep=(); [ "$keep_logs" = 1 ] && keep=(--keep-logs)
    "$repo/scripts/cluster.sh" down --state "$state" "${keep[@]}" >&2 || say "cluster.sh down failed"
  fi
}
trap finish EXIT

if [ ! -e "$state/pids" ]; then
  [ "$(id -u)" -eq 0 ] || die "no cluster in $state, and bringing one up with real nodes needs root"
  [ -n "$k8s" ] && up_args+=(--k8s-version "$k8s")
  say "no cluster in $state: bringing one up (scripts/cluster.sh up --state $state ${up_args[*]})"
  brought_up=1
  "$repo/scripts/cluster.sh" up --state "$state" "${up_args[@]}" >&2
  [ -n "$out" ] || out=/tmp/ipkeep-conformance
fi
[ -n "$out" ] || out=$state/conformance
[ -f "$state/k8s-version" ] || die "$state has no k8s-version: not a cluster of scripts/cluster.sh"
cluster_k8s=$(cat "$state/k8s-version")
[ -z "$k8s" ] || [ "$k8s" = "$cluster_k8s" ] || die "the cluster in $state runs $cluster_k8s, not $k8s"
bin=$(cat "$state/bin")
kubeconfig=$state/admin.kubeconfig
kubectl=("$bin/kubectl" --kubeconfig "$kubeconfig")
mapfile -t nodes < <(for d in "$state"/nodes/*/; do [ -d "$d" ] && basename "$d"; done)
[ ${#nodes[@]} -gt 0 ] || die "the cluster in $state has no real nodes (scripts/cluster.sh up --nodes 2)"
rm -rf "$out"; mkdir -p "$out"

say "building e2e.test and agnhost for $cluster_k8s (scripts/e2e-build.sh; cached)"
e2e_dir=$("$repo/scripts/e2e-build.sh" --k8s-version "$cluster_k8s" --print-dir | tail -1)
e2e=$e2e_dir/e2e.test

# Only what the chosen tests pull is built; the others are listed so a new test's need shows.
say "building the images the tests pull"
mapfile -t refs < <("$e2e" --list-images 2>/dev/null | grep -E '^registry\.k8s\.io/(e2e-test-images/)?(agnhost|busybox|pause):' || true)
[ ${#refs[@]} -gt 0 ] || die "e2e.test --list-images named no agnhost, busybox or pause image"
agnhost_src=$(cd "$repo/tests/k8s/tools/e2e/$cluster_k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost
python3 "$repo/scripts/e2e-images.py" --agnhost "$e2e_dir/agnhost" --agnhost-src "$agnhost_src" \
  --out "$out/images" "${refs[@]}" >"$out/images.txt"
for node in "${nodes[@]}"; do
  say "  importing ${#refs[@]} images into $node"
  while read -r file _; do
    # (containerd 2.x warns about cgroup v1 on every call: kept out of sight unless it fails.)
    "$repo/scripts/cluster.sh" node exec "$node" --state "$state" -- \
      ctr -a /run/containerd/containerd.sock -n k8s.io images import "$file" >/dev/null 2>"$out/import.err" ||
      { cat "$out/import.err" >&2; die "importing $file into $node failed"; }
  done <"$out/images.txt"
done
rm -rf "$out/images" "$out/import.err"

# Watches: every PersistentPodState, and every pod a StatefulSet owns, as they change.
"${kubectl[@]}" get persistentpodstates.ipkeep.dev -A --watch --no-headers \
  -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name >"$out/pps.log" 2>&1 &
pids+=($!)
"${kubectl[@]}" get pods -A --watch --no-headers \
  -o 'custom-columns=NS:.metadata.namespace,NAME:.metadata.name,UID:.metadata.uid,OWNER:.metadata.ownerReferences[0].kind,NODE:.spec.nodeName,IP:.status.podIP,PHASE:.status.phase' \
  >"$out/pods.log" 2>&1 &
pids+=($!)

say "running e2e.test (focus: $focus${skip:+; skip: $skip}); log: $out/e2e.log"
args=(--provider=local --kubeconfig="$kubeconfig" --kubectl-path="$bin/kubectl"
  --namespace-label="$label" --report-dir="$out" --ginkgo.junit-report="$out/junit.xml"
  --ginkgo.focus="$focus" --ginkgo.v --ginkgo.no-color --ginkgo.timeout=2h)
[ -z "$skip" ] || args+=(--ginkgo.skip="$skip")
started=$(date +%s)
rc=0
"$e2e" "${args[@]}" >"$out/e2e.log" 2>&1 &
e2e_pid=$!
next=$((started + 30))
while kill -0 "$e2e_pid" 2>/dev/null; do
  sleep 1
  if [ "$(date +%s)" -ge "$next" ]; then
    say "  $(( $(date +%s) - started )) s: $(grep -c '^• \[' "$out/e2e.log" || true) tests done, $(grep -c '^• \[FAILED\]' "$out/e2e.log" || true) failed"
    next=$((next + 30))
  fi
done
wait "$e2e_pid" || rc=$?
elapsed=$(( $(date +%s) - started ))
sleep 2
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
pids=()

python3 - "$out" "$elapsed" "$label" >"$out/summary.txt" <<'EOF'
import collections, sys, xml.etree.ElementTree as ET
out, elapsed, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    root = ET.parse(f"{out}/junit.xml").getroot()
except (OSError, ET.ParseError) as e:
    print(f"no junit report ({e}): see {out}/e2e.log")
    sys.exit(0)
counts = collections.Counter()
print(f"e2e.test ran {elapsed} s; namespaces labelled {label}")
for case in root.iter("testcase"):
    if not case.get("name", "").startswith("[It]"):
        continue  # the suite's own set-up and reports, not tests
    if case.find("skipped") is not None:
        counts["skipped"] += 1
        continue
    status = "FAILED" if (case.find("failure") is not None or case.find("error") is not None) else "passed"
    counts[status] += 1
    print(f"  {status:7} {float(case.get('time', 0)):7.1f} s  {case.get('name')}")
print(f"passed: {counts['passed']}; failed: {counts['FAILED']}; not selected: {counts['skipped']}")
pps = {tuple(l.split()[:2]) for l in open(f"{out}/pps.log") if len(l.split()) >= 2 and l.split()[0] != "No"}
print(f"PersistentPodStates generated during the run: {len(pps)}; namespaces: {len({n for n, _ in pps})}")
# A rebuild: a pod of a StatefulSet seen under a new uid; compare where the previous one ran.
first = {}  # (ns, name, uid) -> (node, ip), the first placement seen with an IP
order = collections.defaultdict(list)
for line in open(f"{out}/pods.log"):
    f = line.split()
    if len(f) < 7 or f[3] != "StatefulSet":
        continue
    ns, name, uid, _, node, ip, _ = f[:7]
    if ip == "<none>" or node == "<none>":
        continue
    if (ns, name, uid) not in first:
        first[(ns, name, uid)] = (node, ip)
        order[(ns, name)].append(uid)
same = moved = 0
for (ns, name), uids in order.items():
    for prev, cur in zip(uids, uids[1:]):
        if first[(ns, name, prev)] == first[(ns, name, cur)]:
            same += 1
        else:
            moved += 1
            print(f"  rebuilt elsewhere: {ns}/{name} {first[(ns, name, prev)]} -> {first[(ns, name, cur)]}")
print(f"StatefulSet pods: {len(order)}; rebuilds: {same + moved}; kept node and IP: {same}; moved: {moved}")
EOF
cat "$out/summary.txt"
say "results in $out (junit.xml, e2e.log, summary.txt)"
exit "$rc"
