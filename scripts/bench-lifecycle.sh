#!/usr/bin/env bash
# What ipkeep's lifecycle hooks add to a pod rebuild, the operator's handshake excluded
# (docs/lifecycle.md; docs/benchmarks.md, "What the lifecycle hooks cost").
#
#   scripts/bench-lifecycle.sh [--rounds N] [--operator-delay MS] [--state DIR]
#
# Brings up a cluster with 2 real nodes (scripts/cluster.sh; needs root), or uses the running one
# in --state DIR, and rebuilds two one-pod StatefulSets on node-0 in turn, N times each (default
# 10): one without hooks (the baseline) and one with preNormal and preDelete on one label and
# markPodNotReady, whose handshake an operator in the test process answers the moment a watch
# shows it, or --operator-delay MS later (a registry's latency; default 0). Prints medians and
# p90s (tests/benches/lifecycle.rs). IPKEEP_TRACE=1 prints every change the bench's watch saw.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
rounds=10
operator_delay=0
state=
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=${2:?}; shift 2 ;;
    --operator-delay) operator_delay=${2:?--operator-delay takes milliseconds}; shift 2 ;;
    --state) state=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-lifecycle: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done

if [ -z "$state" ]; then
  work=$(mktemp -d /tmp/ipkeep-bench-lifecycle.XXXXXX)
  state=$work/c
  trap '"$repo/scripts/cluster.sh" down --state "$state" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
  echo "bench-lifecycle: starting a cluster with 2 real nodes (scripts/cluster.sh up)" >&2
  "$repo/scripts/cluster.sh" up --state "$state" --port-base 24000 >&2
fi
cd "$repo"
IPKEEP_CLUSTER_STATE=$state IPKEEP_ROUNDS=$rounds IPKEEP_OPERATOR_DELAY_MS=$operator_delay \
  cargo bench -q --locked -p ipkeep-tests --bench lifecycle
