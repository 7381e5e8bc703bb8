#!/usr/bin/env bash
# Upgrade, rollback and uninstall of ipkeep under load, on a real-node cluster (root): from an
# older version, installed the way its own docs said, to this tree's, installed from its release
# bundle (scripts/release-bundle.sh), as docs/install.md, "Upgrade", tells an operator.
#
#   scripts/upgrade-test.sh [--from 0.1.0|0.2.0] [--k8s-version V] [--old-tree DIR] [--state DIR]
#                           [--port-base P] [--replicas N] [--every S] [--keep]
#
# 1. The old version: a checkout of its commit (a `git worktree` at --old-tree, default
#    /tmp/ipkeep-upgrade-VERSION, made if missing) brings up 2 real nodes with its own
#    scripts/cluster.sh, which installs it as its docs said, on --k8s-version (default: v1.37.2
#    from 0.1.0, v1.35.4 from 0.2.0, so that CI covers both ends of the supported window):
#    - 0.1.0 (f67c38b, the last commit before the Helm chart): `kubectl apply -k` of an overlay
#      of its deploy/ (with the deploy/cni component) and deploy/scheduler-ext/make-certificate.sh;
#    - 0.2.0 (d62b71e): `helm install` of its chart (release 1; the CRD from the chart's crds/).
#    Its release build goes to a cargo target directory of its own, kept between runs in
#    $IPKEEP_UPGRADE_CACHE (default /var/cache/ipkeep-upgrade), one per old commit and
#    compiler: the first run compiles the old version (about 10 minutes on two cores), the
#    next ones find it built.
# 2. Load: two StatefulSets of N pods (--replicas, default 3) annotated as README says
#    (auto-generate-persistent-pod-state, required-persistent-topology=kubernetes.io/hostname),
#    and a loop that deletes one of their pods every S seconds (--every, default 3) and records
#    its node and IP before and after, its creation→Running time and whether it was pinned at
#    admission. On each node a loop runs /opt/cni/bin/ipkeep's VERSION command every 0.2 s and
#    notes which binary answered (its sha256).
# 3. The Helm steps, with this tree's bundle (its image imported into the nodes, its packaged
#    chart), each under load:
#    - from 0.1.0: its PodDisruptionBudgets deleted, then adopt (`helm upgrade --install
#      --take-ownership --force-conflicts` with this version's image, which this chart's flags
#      need, and admission.mode=webhook: release 1), then the kustomize generator's ConfigMap
#      ipkeep-cni-config-<hash> deleted; upgrade (admission.mode auto: release 2); rollback (`helm rollback ipkeep 1`:
#      release 3); again (the upgrade once more: release 4);
#    - from 0.2.0: upgrade (`helm upgrade --take-ownership --force-conflicts`: the CRD 0.2.0's
#      crds/ made is no release object; release 2); rollback (release 3); again (release 4).
#    After each step the test audits: no address has two owners, each node's store holds
#    exactly its running pods' addresses, the PersistentPodState records match the pods and
#    are the ones recorded before the step, kube-apiserver logged no failed webhook call, the
#    pinning path is the one the release asks for (the admission policy ipkeep-pin and no
#    mutating webhook configuration, or the webhook configuration and no policy), and once
#    this version runs, the CRD is this chart's.
# 4. Uninstall (docs/install.md, "Uninstall"): `helm uninstall ipkeep -n ipkeep-system --wait`;
#    the running pods keep running, their IPs and their reachability (ping from a pod on the
#    other node); new pods start (the plugin serves without the agent); Helm kept the CRD and,
#    where the admission policy ran, the anchor ipkeep-configmap-parameters-anchor (on purpose:
#    docs/scheduler-ext.md). Then the CNI switch back, node by node: drain, replace
#    10-ipkeep.conflist with the same bridge configuration with host-local IPAM, remove ipkeep's
#    node files, uncordon; new pods start again; the admission plans, the anchor, the CRD and the
#    namespace are deleted by hand as the docs say, and nothing named ipkeep is left: no webhook
#    configuration, admission policy or binding, ClusterRole(Binding), CRD, namespace, admission
#    plan ConfigMap; on the nodes no /opt/cni/bin/ipkeep, no conflist naming ipkeep, no
#    /var/lib/cni/ipkeep, /run/ipkeep or /var/log/ipkeep.log.
#
# This version's bundle is $IPKEEP_BUNDLE (scripts/test.sh makes one per run) or made by
# scripts/release-bundle.sh from this tree's release build; the old version's images by the old
# tree's scripts/images.py (tag the old version; its cluster.sh imports them as :dev too).
# --state (default /tmp/ipkeep-upgrade) and --port-base (default 16540) are the cluster's
# (scripts/cluster.sh); the test's own files go in STATE-test (rebuilds.tsv, the audits, helm's
# output). The cluster is torn down at the end, pass or fail (--keep leaves it running; then
# OLD_TREE/scripts/cluster.sh down --state STATE). Exits 0 only if every expectation held; the
# last lines are the figures. scripts/test.sh runs it in CI from 0.1.0 on v1.37.2 and from
# 0.2.0 on v1.35.4, with 2 replicas ($IPKEEP_UPGRADE_FROM there chooses). Run it
# under the locks of docs/cluster.md (real nodes, heavy).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
from=0.1.0
old_tree=
k8s_version=
state=/tmp/ipkeep-upgrade
port_base=16540
replicas=3
every=3
keep=0
ns=upgrade-load
sys_ns=ipkeep-system
network=k8s-pod-network

say() { printf '[upgrade-test %s] %s\n' "$(date -u +%T)" "$*" >&2; }
die() { printf 'upgrade-test: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --from) from=${2:?--from needs 0.1.0 or 0.2.0}; shift 2 ;;
    --k8s-version) k8s_version=${2:?--k8s-version needs a release such as v1.37.2}; shift 2 ;;
    --old-tree) old_tree=${2:?--old-tree needs a directory}; shift 2 ;;
    --state) state=${2:?--state needs a directory}; shift 2 ;;
    --port-base) port_base=${2:?--port-base needs a port}; shift 2 ;;
    --replicas) replicas=${2:?--replicas needs a number}; shift 2 ;;
    --every) every=${2:?--every needs seconds}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $replicas =~ ^[1-9][0-9]*$ ]] || die "--replicas takes a positive number, got '$replicas'"
[[ $every =~ ^[0-9]+$ ]] || die "--every takes whole seconds, got '$every'"
[ "$(id -u)" = 0 ] || die "real nodes need root (scripts/cluster.sh up --nodes 2)"
# The old versions: their commit, and the Kubernetes release CI runs each on.
case $from in
  0.1.0) old_commit=f67c38b default_k8s=v1.37.2 ;;
  0.2.0) old_commit=d62b71e default_k8s=v1.35.4 ;;
  *) die "--from takes 0.1.0 or 0.2.0, got '$from'" ;;
esac
k8s_version=${k8s_version:-$default_k8s}
default_tree=/tmp/ipkeep-upgrade-$from
old_tree=${old_tree:-$default_tree}
state=$(realpath -m "$state")
work=$state-test
check=(python3 "$repo/scripts/upgrade_check.py")

# --- the trees, the builds, the images -------------------------------------------------------

version_of() { sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$1/Cargo.toml" | head -1; }

old_tree_ready() {
  # A worktree of another clone (the checkout of an earlier CI run, since deleted) cannot be
  # used: the default one is made again.
  if [ "$old_tree" = "$default_tree" ] && [ -e "$old_tree/.git" ] &&
    [ "$(git -C "$old_tree" rev-parse HEAD 2>/dev/null)" != "$(git -C "$repo" rev-parse "$old_commit^{commit}")" ]; then
    say "removing $old_tree (not a worktree of $old_commit in this clone)"
    rm -rf "$old_tree"
    git -C "$repo" worktree prune
  fi
  if [ ! -e "$old_tree/.git" ]; then
    say "making the old tree: git worktree add --detach $old_tree $old_commit"
    git -C "$repo" worktree add --detach "$old_tree" "$old_commit" >&2 || die "git worktree add $old_tree $old_commit failed"
  fi
  local head want
  head=$(git -C "$old_tree" rev-parse HEAD) want=$(git -C "$repo" rev-parse "$old_commit^{commit}")
  [ "$head" = "$want" ] || die "$old_tree is at $head, not $old_commit: remove it (git worktree remove) or pass --old-tree"
}

# The old version builds into a target directory of its own, kept between runs (cargo finds it
# up to date: seconds instead of a release build of every crate), with this tree's compiler.
target=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
toolchain=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$repo/rust-toolchain.toml")
triple=$(rustc -vV | sed -n 's/^host: //p')
old_target=${IPKEEP_UPGRADE_CACHE:-/var/cache/ipkeep-upgrade}/$old_commit-rust$toolchain

# old_env CMD...: CMD as the old tree runs it: its own target directory, this tree's compiler,
# and none of the variables that point scripts/cluster.sh at this tree's builds.
old_env() {
  mkdir -p "$old_target"
  env -u IPKEEP_RELEASE_DIR -u IPKEEP_PLUGIN -u IPKEEP_BUNDLE -u IPKEEP_NODE_LAYOUT \
    -u IPKEEP_WITHOUT_EXTENDER -u IPKEEP_K8S_VERSION -u IPKEEP_CLUSTER_STATE -u IPKEEP_CNI_DATA_SIZE \
    CARGO_TARGET_DIR="$old_target" RUSTUP_TOOLCHAIN="$toolchain" "$@"
}

build_new() {
  (cd "$repo" && . scripts/lib/cargo-env.sh && drop_test_cargo_env &&
    cargo build -q --locked --release -p ipkeep-agent --bin ipkeep-agent -p ipkeep-controller \
      --bin ipkeep-controller -p ipkeep-scheduler-ext --bin ipkeep-scheduler-ext) ||
    die "cargo build --release failed in $repo"
  "$repo/scripts/build-plugin.sh" | tail -1 || die "scripts/build-plugin.sh failed in $repo"
}

# bundle_new: this version's release bundle: $IPKEEP_BUNDLE (checked against its SHA256SUMS), or
# scripts/release-bundle.sh of this tree's release build into STATE-test/bundle.
bundle_new() {
  if [ -n "${IPKEEP_BUNDLE:-}" ]; then
    (cd "$IPKEEP_BUNDLE" && sha256sum --quiet -c SHA256SUMS) || die "IPKEEP_BUNDLE=$IPKEEP_BUNDLE does not match its SHA256SUMS"
    bundle=$IPKEEP_BUNDLE
    say "this version: the release bundle $bundle (IPKEEP_BUNDLE)"
    return
  fi
  say "building this tree's release binaries and static plugin, and its release bundle"
  local plugin
  plugin=$(build_new)
  bundle=$work/bundle
  "$repo/scripts/release-bundle.sh" "$bundle" --allow-dirty --release-dir "$target/release" --plugin "$plugin" >/dev/null ||
    die "scripts/release-bundle.sh failed"
}

images_old() {
  local out=$1
  python3 "$old_tree/scripts/images.py" --release-dir "$old_target/release" --plugin "$old_target/$triple/release/ipkeep" \
    --out "$out" --tag "$old_version" >"$out.txt" || die "$old_tree/scripts/images.py failed"
}

# --- the cluster ------------------------------------------------------------------------------

k() { KUBECONFIG="$state/admin.kubeconfig" "$(cat "$state/bin")/kubectl" "$@"; }
helm() { "$helm_bin" --kubeconfig "$state/admin.kubeconfig" "$@"; }
nodes=(node-0 node-1)
node_root() { echo "$state/nodes/$1/root"; }
on_node() { local n=$1; shift; nsenter -t "$(cat "$state/pids/$n-holder")" -m -n -- "$@"; }

teardown() {
  if [ -n "${load_pid:-}" ]; then kill "$load_pid" 2>/dev/null || true; fi
  local p
  for p in "${watch_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then
    say "kept running (--keep): $old_tree/scripts/cluster.sh down --state $state"
  elif [ -e "$state/bin" ]; then
    say "tearing down the cluster"
    "$old_tree/scripts/cluster.sh" down --state "$state" --keep-logs >&2 || say "cluster.sh down failed"
  fi
}

import_images() {
  local n f
  for n in "${nodes[@]}"; do
    for f in "$@"; do
      on_node "$n" "$(awk '{print $2}' "$state/runtime")/bin/ctr" -a /run/containerd/containerd.sock -n k8s.io \
        images import "$f" >/dev/null || die "$n: importing $f failed"
    done
  done
}

# --- expectations -------------------------------------------------------------------------------

fails=0
expect() { # expect OK TEXT
  if [ "$1" = 0 ]; then echo "ok $2" >>"$work/results"; say "ok: $2"
  else echo "FAIL $2" >>"$work/results"; say "FAIL: $2"; fails=$((fails + 1)); fi
}
# check_that TEXT CMD...: the expectation that CMD succeeds.
check_that() {
  local text=$1; shift
  if "$@"; then expect 0 "$text"; else expect 1 "$text"; fi
}
# expect_lines FILE: the ok/FAIL lines of upgrade_check.py.
expect_lines() {
  local line
  while IFS= read -r line; do
    case $line in
      ok\ *) expect 0 "${line#ok }" ;;
      FAIL\ *) expect 1 "${line#FAIL }" ;;
      *) echo "$line" >&2 ;;
    esac
  done <"$1"
}

phase() { echo "$1" >"$work/phase"; say "== $1"; }
webhook_failures() { grep -ci 'failed calling webhook' "$state/logs/kube-apiserver.log" || true; }

snapshot() { # snapshot NAME: pods, records and node stores into $work/NAME.*
  local n
  k get pods -A -o json >"$work/$1.pods.json"
  k get persistentpodstates -A -o json >"$work/$1.pps.json" 2>/dev/null || echo '{"items":[]}' >"$work/$1.pps.json"
  for n in "${nodes[@]}"; do
    on_node "$n" /opt/cni/bin/ipkeep list --json --network "$network" >"$work/$1.store-$n.json" 2>"$work/$1.store-$n.err" ||
      echo '{"leases":[]}' >"$work/$1.store-$n.json"
  done
}

# audit NAME: the checks of upgrade_check.py audit, retried for up to 60 s (a store frees a
# deleted pod's address a moment after the pod is gone), then recorded.
audit() {
  local name=$1 t=0 stores=() n
  for n in "${nodes[@]}"; do stores+=(--store "$n=$work/$name.store-$n.json"); done
  if [ -n "${load_pid:-}" ]; then
    touch "$work/pause-load"
    until [ -e "$work/load-idle" ]; do sleep 0.5; done
  fi
  while :; do
    snapshot "$name"
    "${check[@]}" audit --pods "$work/$name.pods.json" --pps "$work/$name.pps.json" "${stores[@]}" >"$work/$name.audit" && break
    [ "$t" -ge 60 ] && break
    sleep 3; t=$((t + 3))
  done
  rm -f "$work/pause-load"
  say "audit $name:"
  expect_lines "$work/$name.audit"
  "${check[@]}" records --pps "$work/$name.pps.json" >"$work/$name.records"
}

# --- load -----------------------------------------------------------------------------------------

statefulset() {
  cat <<EOF
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: $1
  namespace: $ns
  annotations:
    ipkeep.dev/auto-generate-persistent-pod-state: "true"
    ipkeep.dev/required-persistent-topology: kubernetes.io/hostname
spec:
  serviceName: $1
  replicas: $replicas
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1, upgrade-load: "true"}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: main
          image: localhost/ipkeep/busybox:dev
          command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
EOF
}

load_pods() { k -n "$ns" get pods -l upgrade-load=true -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort; }

# load_loop: deletes one StatefulSet pod every $every s, round robin, and appends to
# rebuilds.tsv: phase, pod, node and IP before, node and IP after, creation→Running s,
# delete→Running s, pinned|unpinned.
load_loop() {
  local i=0 pods p uid n0 ip0 ph t0 t1 out n1 ip1 c2r pin waited
  set +e
  while [ ! -e "$work/stop-load" ]; do
    # Paused while an audit runs (a pod being rebuilt has its address held, not active).
    while [ -e "$work/pause-load" ] && [ ! -e "$work/stop-load" ]; do touch "$work/load-idle"; sleep 0.5; done
    rm -f "$work/load-idle"
    mapfile -t pods < <(load_pods)
    [ "${#pods[@]}" -gt 0 ] || { sleep 1; continue; }
    p=${pods[$((i % ${#pods[@]}))]}; i=$((i + 1))
    read -r uid n0 ip0 < <(k -n "$ns" get pod "$p" -o jsonpath='{.metadata.uid} {.spec.nodeName} {.status.podIP}{"\n"}') || continue
    [ -n "$ip0" ] || { sleep 1; continue; }
    ph=$(cat "$work/phase")
    t0=$(date +%s.%N)
    k -n "$ns" delete pod "$p" --wait=false >/dev/null 2>&1 || continue
    waited=0 out=""
    while [ "$waited" -lt 240 ]; do
      out=$(k -n "$ns" get pod "$p" -o json 2>/dev/null | python3 -c '
import json, sys, datetime
p = json.load(sys.stdin)
def t(s): return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").timestamp()
st = p.get("status", {})
run = [c["state"]["running"]["startedAt"] for c in st.get("containerStatuses") or [] if "running" in c.get("state", {})]
if p["metadata"]["uid"] != sys.argv[1] and run and st.get("podIP") and not p["metadata"].get("deletionTimestamp"):
    pin = "pinned" if "ipkeep.dev/pinned-by" in p["metadata"].get("annotations", {}) else "unpinned"
    print(p["spec"]["nodeName"], st["podIP"], int(t(run[0]) - t(p["metadata"]["creationTimestamp"])), pin)
' "$uid" 2>/dev/null || true)
      [ -n "$out" ] && break
      sleep 0.5; waited=$((waited + 1))
    done
    t1=$(date +%s.%N)
    if [ -n "$out" ]; then
      read -r n1 ip1 c2r pin <<<"$out"
    else
      n1=- ip1=timeout c2r=0 pin=unpinned
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\n' "$ph" "$ns/$p" "$n0" "$ip0" "$n1" "$ip1" "$c2r" \
      "$(awk "BEGIN {print $t1 - $t0}")" "$pin" >>"$work/rebuilds.tsv"
    sleep "$every"
  done
}

# plugin_watch NODE: every 0.2 s, does /opt/cni/bin/ipkeep answer VERSION, and which binary is it.
plugin_watch() {
  local f out sum
  set +e
  f=$(node_root "$1")/opt/cni/bin/ipkeep
  while [ ! -e "$work/stop-watch" ]; do
    if [ ! -e "$f" ]; then
      echo "missing"
    elif out=$(CNI_COMMAND=VERSION timeout 5 "$f" </dev/null 2>&1) && [[ $out == *supportedVersions* ]]; then
      sum=$(sha256sum <"$f"); echo "ok ${sum:0:12}"
    else
      echo "bad ${out//$'\n'/ }"
    fi
    sleep 0.2
  done >>"$work/plugin-$1.log"
}

wait_rollouts() {
  local w
  for w in deployment/ipkeep-controller deployment/ipkeep-scheduler-ext daemonset/ipkeep-agent; do
    k -n "$sys_ns" rollout status "$w" --timeout=300s >/dev/null || { expect 1 "$w rolled out within 300 s"; return 0; }
  done
}

images_running() {
  k -n "$sys_ns" get pods -o jsonpath='{range .items[*]}{.spec.containers[0].image}{"\n"}{end}' | sort | uniq -c | tr '\n' ';'
}

# pinning MODE: the admission objects are those of MODE (policy: the MutatingAdmissionPolicy
# ipkeep-pin and its binding, no mutating webhook configuration ipkeep-scheduler-ext; webhook:
# that configuration with its pinning webhook, no policy). On Kubernetes without the policy's
# API there is none to find.
pinning() {
  local mode=$1 mwc map
  mwc=$(k get mutatingwebhookconfiguration ipkeep-scheduler-ext -o jsonpath='{range .webhooks[*]}{.name} {end}' 2>/dev/null || echo none)
  map=$(k get mutatingadmissionpolicy ipkeep-pin -o name 2>/dev/null || echo none)
  if [ "$mode" = policy ]; then
    [ "$mwc" = none ] && [ "$map" != none ]
  else
    [[ "$mwc" == *pin.ipkeep.dev* ]] && [[ "$map" == none* ]]
  fi
}

# crd_is_this_charts: the served CRD's versions and schema are this chart's (crds.manage).
crd_is_this_charts() {
  k get crd persistentpodstates.ipkeep.dev -o json >"$work/crd.json" &&
    k create --dry-run=client -o json -f "$bundle/crd.yaml" >"$work/crd-want.json" &&
    "${check[@]}" crd --got "$work/crd.json" --want "$work/crd-want.json" >&2
}

# step NAME MODE CMD...: a Helm step under load, timed, then audited; MODE is the pinning path
# the release it makes asks for (policy or webhook), "new" in MODE (policy+new) when it runs
# this version.
step() {
  local name=$1 mode=$2 t0 t1 wf0 wf1 rc=0; shift 2
  phase "$name"
  wf0=$(webhook_failures)
  cp "$work/$prev.records" "$work/before-$name.records"
  t0=$(date +%s)
  "$@" >"$work/$name.helm.log" 2>&1 || rc=$?
  expect "$rc" "$name: $(printf '%q ' "${@/#$repo\//}") (log: $work/$name.helm.log)"
  wait_rollouts
  t1=$(date +%s)
  say "$name: done in $((t1 - t0)) s; ipkeep pods run: $(images_running)"
  echo "$name $((t1 - t0))" >>"$work/times"
  sleep $((every * 3))
  audit "$name"
  "${check[@]}" carried --before "$work/before-$name.records" --after "$work/$name.records" >"$work/$name.carried" || true
  expect_lines "$work/$name.carried"
  wf1=$(webhook_failures)
  expect $((wf1 != wf0)) "$name: kube-apiserver logged no failed webhook call ($((wf1 - wf0)) new)"
  check_that "$name: pods are pinned by the ${mode%+new} (the objects of admission.mode: $(admission_objects))" pinning "${mode%+new}"
  if [[ $mode == *+new ]]; then
    check_that "$name: the CRD is this chart's (crds.manage)" crd_is_this_charts
  fi
  prev=$name
}

admission_objects() {
  { k get mutatingwebhookconfiguration,mutatingadmissionpolicy -o name 2>/dev/null || true; } | grep ipkeep | tr '\n' ' '
}

main() {
  rm -rf "$work"; mkdir -p "$work"
  echo old >"$work/phase"
  : >"$work/rebuilds.tsv"; : >"$work/results"; : >"$work/times"
  old_tree_ready
  local new_version t_start
  old_version=$(version_of "$old_tree") new_version=$(version_of "$repo")
  [ "$old_version" = "$from" ] || die "$old_tree ($old_commit) is version $old_version, not $from"
  [ "$old_version" != "$new_version" ] || die "the old and new trees have the same version $new_version: bump [workspace.package] version"
  say "old: $old_commit ($old_version) in $old_tree; new: $(git -C "$repo" rev-parse --short HEAD) ($new_version); Kubernetes $k8s_version"
  helm_bin=$("$repo/scripts/helm-build.sh" --print-dir | tail -1)/bin/helm
  bundle_new
  chart=$bundle/ipkeep-$new_version.tgz
  [ -f "$chart" ] || die "the bundle $bundle has no ipkeep-$new_version.tgz"
  image_new=$(sed -n 's/^image: \(\S*\).*/\1/p' "$bundle/RELEASE")
  t_start=$(date +%s)

  say "starting 2 real nodes with $old_version installed by its own scripts/cluster.sh"
  watch_pids=()
  trap teardown EXIT
  trap 'exit 130' INT TERM
  old_env "$old_tree/scripts/cluster.sh" up --nodes 2 --state "$state" --port-base "$port_base" \
    --k8s-version "$k8s_version" >&2 || die "the old tree's cluster.sh up failed (logs: $state/logs)"
  echo "$(( $(date +%s) - t_start ))" >"$work/up-seconds"
  say "importing the images: localhost/ipkeep/ipkeep:$old_version (old tree), $image_new (the bundle)"
  images_old "$work/images-old"
  import_images "$work/images-old/ipkeep.tar" "$bundle/ipkeep-image.tar"

  say "load: 2 StatefulSets of $replicas pods in $ns, one pod deleted every $every s"
  k create namespace "$ns" >/dev/null
  { statefulset db-a; echo ---; statefulset db-b; } | k apply -f - >/dev/null
  k -n "$ns" rollout status statefulset/db-a --timeout=180s >/dev/null || die "db-a did not become Ready"
  k -n "$ns" rollout status statefulset/db-b --timeout=180s >/dev/null || die "db-b did not become Ready"
  local t=0
  until [ "$(k -n "$ns" get pps -o jsonpath='{range .items[*]}{.status.recordedPods}{"\n"}{end}' 2>/dev/null | awk '{s+=$1} END {print s+0}')" -ge $((2 * replicas)) ]; do
    [ "$t" -ge 120 ] && die "the PersistentPodStates did not record the $((2 * replicas)) pods within 120 s"
    sleep 2; t=$((t + 2))
  done
  local n
  for n in "${nodes[@]}"; do plugin_watch "$n" & watch_pids+=($!); done
  load_loop & load_pid=$!
  sleep $((every * 8))
  audit old
  prev=old

  # The pinning path this version takes with admission.mode auto.
  local auto=webhook
  k api-resources --api-group=admissionregistration.k8s.io -o name >"$work/api-resources" 2>/dev/null || true
  grep -q '^mutatingadmissionpolicies\.' "$work/api-resources" && auto=policy
  local new_image=(--set image.repository="${image_new%:*}" --set image.tag="${image_new##*:}")
  if [ "$from" = 0.1.0 ]; then
    # What a user of 0.1.0 passes to the chart: the Service's fixed cluster IP of the
    # kube-scheduler stanza, the CA make-certificate.sh put in the webhook configurations, and
    # the webhook: 0.1.0's controller writes no admission plan for the policy to read.
    local ca
    ca=$(k get mutatingwebhookconfiguration ipkeep-scheduler-ext -o jsonpath='{.webhooks[0].clientConfig.caBundle}')
    [ -n "$ca" ] || die "the old install's webhook configuration has no caBundle"
    cat >"$work/values.yaml" <<EOF
image: {repository: localhost/ipkeep/ipkeep, tag: "$old_version"}
schedulerExt: {service: {clusterIP: "$(k -n "$sys_ns" get service ipkeep-scheduler-ext -o jsonpath='{.spec.clusterIP}')"}}
webhook: {caBundle: "$ca"}
selfManagedCertificates: {enabled: false}
cni: {enabled: true}
admission: {mode: webhook}
EOF
    # 0.1.0's PodDisruptionBudgets set minAvailable through kubectl; the chart's set
    # maxUnavailable, and server-side apply keeps the field another manager set: the API server
    # refuses a budget with both (docs/install.md). Helm makes them again a moment later.
    k -n "$sys_ns" delete pdb ipkeep-controller ipkeep-scheduler-ext --ignore-not-found >/dev/null
    # Adopted with this version's image: this chart passes flags 0.1.0's binaries do not know
    # (--probe-listen, --metrics-listen), so 0.1.0's image cannot run under it.
    step adopt webhook+new helm upgrade --install ipkeep "$chart" -n "$sys_ns" --take-ownership --force-conflicts \
      --wait=watcher --timeout 5m -f "$work/values.yaml" "${new_image[@]}"
    local stale cm
    stale=$(k -n "$sys_ns" get configmap -l app.kubernetes.io/part-of=ipkeep -o name | grep -E '/ipkeep-cni-config-[a-z0-9]+$' || true)
    for cm in $stale; do k -n "$sys_ns" delete "$cm" >/dev/null; done
    say "deleted kustomize's generated ConfigMap(s): ${stale:-none}"
    step upgrade "$auto+new" helm upgrade ipkeep "$chart" -n "$sys_ns" --wait=watcher --timeout 5m \
      -f "$work/values.yaml" "${new_image[@]}" --set admission.mode=auto
    step rollback webhook+new helm rollback ipkeep 1 -n "$sys_ns" --wait=watcher --timeout 5m
    step again "$auto+new" helm upgrade ipkeep "$chart" -n "$sys_ns" --wait=watcher --timeout 5m \
      -f "$work/values.yaml" "${new_image[@]}" --set admission.mode=auto
  else
    # 0.2.0's cluster.sh installed it with these values (its image as :dev); the CRD came from
    # its chart's crds/, outside the release: --take-ownership --force-conflicts
    # (docs/install.md, "Upgrade").
    local old_mode
    old_mode=$(cat "$state/admission")
    cp "$state/ipkeep-values.yaml" "$work/values.yaml"
    step upgrade "$auto+new" helm upgrade ipkeep "$chart" -n "$sys_ns" --take-ownership --force-conflicts \
      --wait=watcher --timeout 5m -f "$work/values.yaml" "${new_image[@]}" --set admission.mode=auto
    step rollback "$old_mode" helm rollback ipkeep 1 -n "$sys_ns" --wait=watcher --timeout 5m
    step again "$auto+new" helm upgrade ipkeep "$chart" -n "$sys_ns" --wait=watcher --timeout 5m \
      -f "$work/values.yaml" "${new_image[@]}" --set admission.mode=auto
  fi
  helm history ipkeep -n "$sys_ns" >"$work/history" 2>&1 || true

  say "stopping the load"
  touch "$work/stop-load"; wait "$load_pid" || true; load_pid=""
  touch "$work/stop-watch"; for n in "${watch_pids[@]}"; do wait "$n" || true; done; watch_pids=()
  local logs=()
  for n in "${nodes[@]}"; do logs+=(--log "$n=$work/plugin-$n.log"); done
  "${check[@]}" plugin "${logs[@]}" >"$work/plugin.check" || true
  expect_lines "$work/plugin.check"
  "${check[@]}" rebuilds --tsv "$work/rebuilds.tsv" >"$work/rebuilds.summary" || true
  grep -v '^ok \|^FAIL ' "$work/rebuilds.summary" >&2 || true
  grep '^ok \|^FAIL ' "$work/rebuilds.summary" >"$work/rebuilds.check" || true
  expect_lines "$work/rebuilds.check"

  uninstall "$auto"
  local total=$(( $(date +%s) - t_start ))
  say "figures:"
  cat "$work/rebuilds.summary" >&2
  cat "$work/history" >&2
  say "step times (s): $(tr '\n' ';' <"$work/times")  cluster up (the old version's build included): $(cat "$work/up-seconds") s; whole run after this version's build: $total s"
  say "$(grep -c '^ok ' "$work/results") expectations held, $fails failed (results: $work/results)"
  [ "$fails" = 0 ] || exit 1
}

# reach A B: pod A pings pod B's IP.
reach() { k -n "$ns" exec "$1" -- ping -c 1 -W 2 "$(k -n "$ns" get pod "$2" -o jsonpath='{.status.podIP}')" >/dev/null 2>&1; }
both_reach() { reach "$1" "$2" && reach "$2" "$1"; }
first_pod_on() { k -n "$ns" get pods -l upgrade-load=true --field-selector "spec.nodeName=$1,status.phase=Running" -o jsonpath='{.items[0].metadata.name}'; }
pods_line() { k -n "$ns" get pods -l upgrade-load=true -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.status.podIP}{"\n"}{end}' | sort; }

# new_pods NAME REPLICAS: a plain pod on each node and db-a scaled to REPLICAS start within
# 90 s, and the two plain pods reach each other.
new_pods() {
  local name=$1 t0 n ok=0
  t0=$(date +%s)
  for n in "${nodes[@]}"; do
    k -n "$ns" run "$name-$n" --image=localhost/ipkeep/busybox:dev --restart=Never \
      --overrides="{\"apiVersion\": \"v1\", \"spec\": {\"nodeName\": \"$n\", \"terminationGracePeriodSeconds\": 1}}" -- sleep 3600 >/dev/null
  done
  k -n "$ns" scale statefulset db-a --replicas="$2" >/dev/null
  for n in "${nodes[@]}"; do
    k -n "$ns" wait --for=condition=Ready "pod/$name-$n" --timeout=90s >/dev/null 2>&1 || ok=1
  done
  k -n "$ns" rollout status statefulset/db-a --timeout=90s >/dev/null 2>&1 || ok=1
  expect "$ok" "$name: new pods start (a plain pod on each node, db-a scaled to $2: $(( $(date +%s) - t0 )) s)"
  check_that "$name: the new pods on the two nodes reach each other" both_reach "$name-node-0" "$name-node-1"
}

# ipkeep_objects KIND...: the objects of these kinds whose name says ipkeep, cluster-wide and in
# every namespace (a kind the server does not serve has none).
ipkeep_objects() {
  local kind
  for kind in "$@"; do
    k get "$kind" -A -o name 2>/dev/null | grep -i ipkeep || true
  done | tr '\n' ' ' | sed 's/ $//'
}

# uninstall AUTO: the uninstall of docs/install.md; AUTO is the pinning path the release had
# (with the admission policy, Helm keeps its anchor on purpose).
uninstall() {
  local auto=$1
  phase uninstall
  local a b before wf0 rc n root left
  a=$(first_pod_on node-0) b=$(first_pod_on node-1)
  before=$(pods_line)
  wf0=$(webhook_failures)
  check_that "helm uninstall ipkeep -n $sys_ns --wait" helm uninstall ipkeep -n "$sys_ns" --wait >"$work/uninstall.helm.log" 2>&1
  k -n "$sys_ns" wait --for=delete pod --all --timeout=120s >/dev/null 2>&1 || true
  check_that "uninstall: the running pods kept running with their IPs ($(wc -l <<<"$before") pods)" test "$before" = "$(pods_line)"
  check_that "uninstall: $a (node-0) and $b (node-1) still reach each other" both_reach "$a" "$b"
  left=$(ipkeep_objects mutatingwebhookconfiguration validatingwebhookconfiguration mutatingadmissionpolicy \
    mutatingadmissionpolicybinding validatingadmissionpolicy validatingadmissionpolicybinding)
  local kept=""
  [ "$auto" = policy ] &&
    kept="validatingadmissionpolicy.admissionregistration.k8s.io/ipkeep-configmap-parameters-anchor validatingadmissionpolicybinding.admissionregistration.k8s.io/ipkeep-configmap-parameters-anchor"
  check_that "uninstall: no ipkeep webhook configuration or admission policy is left but the anchor Helm keeps on purpose (${left:-none})" \
    test "$left" = "$kept"
  check_that "uninstall: Helm kept the CRD (helm.sh/resource-policy: keep)" k get crd persistentpodstates.ipkeep.dev -o name
  new_pods after-uninstall $((replicas + 1))
  check_that "uninstall: kube-apiserver logged no failed webhook call" test "$(webhook_failures)" = "$wf0"
  audit uninstalled

  say "switching the nodes back to host-local, one at a time (drain, conflist, node files, uncordon)"
  for n in "${nodes[@]}"; do
    root=$(node_root "$n")
    check_that "$n: kubectl drain" k drain "$n" --ignore-daemonsets --delete-emptydir-data --force --timeout=120s >>"$work/drain.log" 2>&1
    if [ -f "$root/etc/cni/net.d/10-ipkeep.conflist" ]; then
      "${check[@]}" conflist --in "$root/etc/cni/net.d/10-ipkeep.conflist" >"$work/10-host-local-$n.conflist" &&
        cp "$work/10-host-local-$n.conflist" "$root/etc/cni/net.d/.10-host-local.conflist.tmp" &&
        mv "$root/etc/cni/net.d/.10-host-local.conflist.tmp" "$root/etc/cni/net.d/10-host-local.conflist"
      rm -f "$root/etc/cni/net.d/10-ipkeep.conflist"
    fi
    rm -rf "$root/opt/cni/bin/ipkeep" "$root/var/lib/cni/ipkeep" "$root/var/log/ipkeep.log"
    on_node "$n" rm -rf /run/ipkeep
    k uncordon "$n" >/dev/null
  done
  check_that "host-local: the drained StatefulSets are Running again" \
    k -n "$ns" rollout status statefulset/db-b --timeout=120s >/dev/null
  new_pods host-local $((replicas + 2))
  snapshot host-local
  "${check[@]}" audit --pods "$work/host-local.pods.json" >"$work/host-local.audit" || true
  expect_lines "$work/host-local.audit"

  # What the docs have the operator delete by hand once ipkeep is gone for good.
  check_that "kubectl delete configmap -A -l ipkeep.dev/admission-plan=true (the admission plans; $(k get configmap -A -l ipkeep.dev/admission-plan=true -o name 2>/dev/null | wc -l) found)" \
    k delete configmap -A -l ipkeep.dev/admission-plan=true --wait=true >/dev/null 2>&1
  if [ "$auto" = policy ]; then
    check_that "kubectl delete validatingadmissionpolicybinding,validatingadmissionpolicy ipkeep-configmap-parameters-anchor" \
      k delete validatingadmissionpolicybinding,validatingadmissionpolicy ipkeep-configmap-parameters-anchor >/dev/null 2>&1
  fi
  check_that "kubectl delete crd persistentpodstates.ipkeep.dev (asked for: every PersistentPodState goes with it)" \
    k delete crd persistentpodstates.ipkeep.dev --wait=true >/dev/null 2>&1
  check_that "kubectl delete namespace $sys_ns" k delete namespace "$sys_ns" --wait=true --timeout=120s >/dev/null 2>&1
  left=$(ipkeep_objects mutatingwebhookconfiguration validatingwebhookconfiguration mutatingadmissionpolicy \
    mutatingadmissionpolicybinding validatingadmissionpolicy validatingadmissionpolicybinding clusterrole \
    clusterrolebinding crd namespace configmap)
  check_that "nothing of ipkeep is left in the API: ${left:-none}" test -z "$left"
  for n in "${nodes[@]}"; do
    root=$(node_root "$n")
    left=$( { ls -d "$root/opt/cni/bin/ipkeep" "$root/var/lib/cni/ipkeep" "$root/var/log/ipkeep.log" 2>/dev/null
              grep -l '"ipkeep"' "$root"/etc/cni/net.d/* 2>/dev/null
              on_node "$n" ls -d /run/ipkeep 2>/dev/null; } | tr '\n' ' ' || true)
    check_that "$n: nothing of ipkeep is left on the node: ${left:-none}" test -z "$left"
  done
}

main
