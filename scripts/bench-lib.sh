# Shared by scripts/bench-cluster.sh and scripts/bench-controller.sh (sourced, not run).
#
# bench_report_build: builds ipkeep-bench-report (tests/src/bench: the statistics and tables
# every benchmark shares) and sets report to its path; the scripts pipe what they measured into
# it.
bench_report_build() {
  say "building ipkeep-bench-report"
  (cd "$repo" && cargo build -q --locked --release -p ipkeep-tests --bin ipkeep-bench-report) ||
    { say "building ipkeep-bench-report failed"; exit 1; }
  report=${CARGO_TARGET_DIR:-$repo/target}/release/ipkeep-bench-report
}
#
# bench_up MODE: a fresh cluster in $state/c with $nodes kwok nodes, ipkeep's release build and
# upstream's node timeouts (and, if set, $pin_cpus as --pin-cpus, $k8s_version as --k8s-version
# and $port_base as --port-base); MODE is none (no ipkeep), webhook or noop (the pin webhook, no
# extender; noop's StatefulSets have no PersistentPodState), full (webhook and extender), policy (the admission policy ipkeep-pin, no extender)
# or policy-full (policy and extender). The webhook modes force --admission webhook: auto would
# pick the policy where the API server serves it (Kubernetes 1.36 and later). Exports
# KUBECONFIG, sets k (the cluster's kubectl) and creates the namespace bench.
bench_up() {
  local mode=$1 flags=()
  case $mode in
    none) flags=(--without-ipkeep) ;;
    webhook|noop) flags=(--without-extender --admission webhook) ;;
    full) flags=(--admission webhook) ;;
    policy) flags=(--without-extender --admission policy) ;;
    policy-full) flags=(--admission policy) ;;
    *) say "unknown mode $mode (none, noop, webhook, full, policy, policy-full)"; exit 1 ;;
  esac
  say "mode $mode: starting a cluster with $nodes kwok nodes"
  [ -n "${pin_cpus:-}" ] && flags+=(--pin-cpus "$pin_cpus")
  [ -n "${k8s_version:-}" ] && flags+=(--k8s-version "$k8s_version")
  [ -n "${port_base:-}" ] && flags+=(--port-base "$port_base")
  "$repo/scripts/cluster.sh" up --nodes 0 --release --upstream-node-timeouts --state "$state/c" \
    --kwok-nodes "$nodes" "${flags[@]}" >"$state/up.out"
  export KUBECONFIG=$state/c/admin.kubeconfig
  k=$(cat "$state/c/bin")/kubectl
  $k create namespace bench >/dev/null
}
