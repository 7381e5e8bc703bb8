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
say() { echo "helm-build: $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=scripts/lib/go-build.sh
. "$repo/scripts/lib/go-build.sh"

cached_build_args IPKEEP_HELM_CACHE /var/cache/ipkeep-helm "$@"
go_require "helm from its module"
helm=$(version_of helm.sh/helm/v4 helm)
cached_build_dir "$cache/helm$helm-$gover" bin

if [ ! -x "$dir/bin/helm" ]; then
  # As Helm's Makefile builds a release: static, the version stamped in (`helm version`).
  go_build "helm $helm" helm CGO_ENABLED=0 \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm -X helm.sh/helm/v4/internal/version.metadata= -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    -o "$dir/bin/helm.tmp" helm.sh/helm/v4/cmd/helm
  mv -f "$dir/bin/helm.tmp" "$dir/bin/helm"
fi
cached_build_ready "$dir/bin/helm ($("$dir/bin/helm" version --short 2>/dev/null || echo "helm $helm"), $gover)"
