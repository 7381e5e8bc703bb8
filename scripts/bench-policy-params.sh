#!/usr/bin/env bash
# What the admission policy's parameter object costs kube-apiserver at every activation of the
# policy ipkeep-pin: the conversion of the whole PersistentPodState to CEL values
# (tests/benches/policy-params, built against kube-apiserver v1.37.2's CEL packages from the Go
# module proxy). For a custom resource it is a JSON round trip of the object, so it grows with
# the records and the plan, not with what the expressions read (docs/benchmarks.md, "Where the
# admission policy's time goes").
#
#   scripts/bench-policy-params.sh PPS.json...
#   scripts/bench-policy-params.sh designs
#
# Each PPS.json is a PersistentPodState as `kubectl get pps NAME -o json` prints it; one at scale
# comes from `scripts/bench-cluster.sh --keep-metrics DIR` (DIR/policy/pps.json, 1,000 replicas
# by default). For each it prints the compact JSON size and the mean time of one conversion as
# stored, without status.podStates and without status.admission (a PersistentPodState of 0.2.0,
# which had a plan in its status).
#
# `designs` compares, at three shapes (one StatefulSet of 1,000, 200 of 5 in one namespace, one
# of 10), what one pod CREATE costs the policy for four ways of giving it the plan: the
# PersistentPodStates (0.2.0), a plan object per StatefulSet, a ConfigMap per StatefulSet, and
# one ConfigMap per namespace (0.3.0): per parameter the binding selects, the conversion and an
# expression reading what ipkeep's policy reads, in kube-apiserver's CEL environment
# (tests/benches/policy-params/designs.go). The binary is cached in
# $IPKEEP_BENCH_CACHE (default /var/cache/ipkeep-bench), by Go version. Needs Go (>= 1.26).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "bench-policy-params: $*" >&2; }
case ${1:-} in
  -h|--help|"") sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; [ -n "${1:-}" ]; exit ;;
esac
command -v go >/dev/null || { say "Go is not installed (https://go.dev/dl, >= 1.26)"; exit 1; }
bin=${IPKEEP_BENCH_CACHE:-/var/cache/ipkeep-bench}/policy-params-$(go env GOVERSION)
mkdir -p "$bin"
src=$repo/tests/benches/policy-params
if [ ! -x "$bin/policy-params" ] || [ -n "$(find "$src" -newer "$bin/policy-params" -type f)" ]; then
  say "building tests/benches/policy-params (kube-apiserver's CEL packages, v1.37.2)"
  (cd "$repo/tests/benches/policy-params" && GOFLAGS=-mod=readonly go build -o "$bin/policy-params.tmp" .)
  mv -f "$bin/policy-params.tmp" "$bin/policy-params"
fi
"$bin/policy-params" "$@"
