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
say() { echo "promtool-build: $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=scripts/lib/go-build.sh
. "$repo/scripts/lib/go-build.sh"

# --server is this script's own flag, without a value.
server=0
args=()
for arg in "$@"; do
  if [ "$arg" = --server ]; then server=1; else args+=("$arg"); fi
done
cached_build_args IPKEEP_PROMETHEUS_CACHE /var/cache/ipkeep-prometheus ${args[@]+"${args[@]}"}
go_require "promtool from its module"
module=$(version_of github.com/prometheus/prometheus promtool)
cached_build_dir "$cache/$module-$gover" bin
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
cached_build_ready "$dir/bin/promtool ($("$dir/bin/promtool" --version 2>/dev/null | head -1 || echo "promtool $module"), $gover)"
