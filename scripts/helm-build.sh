#!/usr/bin/env bash
# Builds helm (Helm 4, helm.sh/helm/v4) from its published Go module into a cache outside the
# repository, and skips the build when it is already cached. charts/ipkeep is linted, rendered
# and (on a cluster) installed with it; deploy/ is rendered from the chart with it
# (scripts/render-deploy.sh).
#
#   scripts/helm-build.sh [--cache DIR] [--print-dir]
#
# The version is the one pinned by the wrapper module tests/k8s/tools/helm (go.mod + go.sum,
# committed; nothing of Helm's source is in this repository). The cache is $IPKEEP_HELM_CACHE
# or --cache (default /var/cache/ipkeep-helm); the build goes in a directory named by the Helm
# and Go versions, so changing one rebuilds and the old build stays until deleted: DIR/bin/helm.
# --print-dir prints DIR (last line).
# Go (>= 1.26) is needed; a cold build takes about 3 minutes on two cores (Go's build cache
# empty), a warm one (cached) under a second.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tools=$repo/tests/k8s/tools
cache=${IPKEEP_HELM_CACHE:-/var/cache/ipkeep-helm}
print_dir=0

say() { echo "helm-build: $*" >&2; }
die() { say "error: $*"; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --cache) cache=${2:?--cache needs a directory}; shift 2 ;;
    --print-dir) print_dir=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

command -v go >/dev/null || die "Go is not installed (needed to build helm from its module; https://go.dev/dl, >= 1.26)"
gover=$(go env GOVERSION)
helm=$(cd "$tools/helm" && go list -m -f '{{.Version}}' helm.sh/helm/v4)
dir=$cache/helm$helm-$gover
mkdir -p "$dir/bin" || die "cannot create the cache directory $dir (set IPKEEP_HELM_CACHE or --cache)"
log=$dir/build.log
started=$(date +%s)
# shellcheck source=scripts/lib/go-build.sh
. "$repo/scripts/lib/go-build.sh"

if [ ! -x "$dir/bin/helm" ]; then
  # As Helm's Makefile builds a release: static, the version stamped in (`helm version`).
  go_build "helm $helm" helm CGO_ENABLED=0 \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm -X helm.sh/helm/v4/internal/version.metadata= -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    -o "$dir/bin/helm.tmp" helm.sh/helm/v4/cmd/helm
  mv -f "$dir/bin/helm.tmp" "$dir/bin/helm"
fi
say "ready in $(( $(date +%s) - started )) s: $dir/bin/helm ($("$dir/bin/helm" version --short 2>/dev/null || echo "helm $helm"), $gover)"
if [ "$print_dir" = 1 ]; then
  echo "$dir"
fi
