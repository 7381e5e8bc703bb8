#!/usr/bin/env bash
# Builds promtool (Prometheus 3, github.com/prometheus/prometheus) from its published Go module
# into a cache outside the repository, and skips the build when it is already cached. It checks
# the chart's alerting rules (scripts/validate-deploy.sh: `promtool check rules` and
# `promtool test rules`). With --server it also builds the Prometheus server itself
# (DIR/bin/prometheus, without the web UI's assets: the HTTP API is what the tests use), which
# scrapes the real-node cluster in tests/tests/e2e/monitoring.rs.
#
#   scripts/promtool-build.sh [--cache DIR] [--server] [--print-dir]
#
# The version is the one pinned by the wrapper module tests/k8s/tools/promtool (go.mod + go.sum,
# committed; nothing of Prometheus's source is in this repository; Prometheus 3.x.y is the
# module version v0.3xx.y). The cache is $IPKEEP_PROMETHEUS_CACHE or --cache (default
# /var/cache/ipkeep-prometheus); the build goes in a directory named by the module and Go
# versions, so changing one rebuilds and the old build stays until deleted: DIR/bin/promtool.
# --print-dir prints DIR (last line).
# Go (>= 1.26) is needed; a cold build took 4.6 minutes on two cores (Go's build cache already
# holding the Kubernetes client packages that the Kubernetes builds put there), the server
# after it 1.4 minutes more, a warm one (cached) under a second.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tools=$repo/tests/k8s/tools
cache=${IPKEEP_PROMETHEUS_CACHE:-/var/cache/ipkeep-prometheus}
print_dir=0
server=0

say() { echo "promtool-build: $*" >&2; }
die() { say "error: $*"; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --cache) cache=${2:?--cache needs a directory}; shift 2 ;;
    --print-dir) print_dir=1; shift ;;
    --server) server=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

command -v go >/dev/null || die "Go is not installed (needed to build promtool from its module; https://go.dev/dl, >= 1.26)"
gover=$(go env GOVERSION)
module=$(cd "$tools/promtool" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
dir=$cache/$module-$gover
mkdir -p "$dir/bin" || die "cannot create the cache directory $dir (set IPKEEP_PROMETHEUS_CACHE or --cache)"
log=$dir/build.log
started=$(date +%s)
# shellcheck source=scripts/lib/go-build.sh
. "$repo/scripts/lib/go-build.sh"

# v0.316.0 is Prometheus 3.16.0: stamped in as Prometheus's Makefile (promu) does.
release=${module#v0.3}
release=3.${release#0}
if [ ! -x "$dir/bin/promtool" ]; then
  go_build "promtool $release" promtool CGO_ENABLED=0 \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release -X github.com/prometheus/common/version.Branch=HEAD" \
    -o "$dir/bin/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool
  mv -f "$dir/bin/promtool.tmp" "$dir/bin/promtool"
fi
if [ "$server" = 1 ] && [ ! -x "$dir/bin/prometheus" ]; then
  go_build "prometheus $release" promtool CGO_ENABLED=0 \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release -X github.com/prometheus/common/version.Branch=HEAD" \
    -o "$dir/bin/prometheus.tmp" github.com/prometheus/prometheus/cmd/prometheus
  mv -f "$dir/bin/prometheus.tmp" "$dir/bin/prometheus"
fi
say "ready in $(( $(date +%s) - started )) s: $dir/bin/promtool ($("$dir/bin/promtool" --version 2>/dev/null | head -1 || echo "promtool $module"), $gover)"
if [ "$print_dir" = 1 ]; then
  echo "$dir"
fi
