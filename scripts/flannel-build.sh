#!/usr/bin/env bash
# Builds flannel for `scripts/cluster.sh up --network flannel` from published Go modules, into
# a cache outside the repository, and skips whatever is already cached: flanneld
# (github.com/flannel-io/flannel) and flannel's CNI plugin.
#
#   scripts/flannel-build.sh [--cache DIR] [--print-dir]
#
# The versions are those pinned by the wrapper modules tests/k8s/tools/flannel and
# tests/k8s/tools/flannel-cni (go.mod + go.sum, committed; nothing of their source is in this
# repository). The Go module proxy refuses flannel's CNI plugin module
# (github.com/flannel-io/cni-plugin: 403 for every version), so the plugin is built from its
# previous home, github.com/containernetworking/plugins v0.9.1 (plugins/meta/flannel, the last
# release that had it): it speaks CNI up to 0.4.0. The cache is $IPKEEP_FLANNEL_CACHE or --cache
# (default /var/cache/ipkeep-flannel); the build goes in a directory named by both versions and
# the Go version, so changing one rebuilds and the old build stays until deleted: DIR/bin/flanneld,
# DIR/cni/flannel. --print-dir prints DIR (last line).
# Go (>= 1.26) and gcc are needed (flanneld's UDP backend uses cgo on amd64, as upstream builds
# it); a cold build takes about 2 minutes on two cores, a warm one (all cached) a second.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "flannel-build: $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=scripts/lib/go-build.sh
. "$repo/scripts/lib/go-build.sh"

cached_build_args IPKEEP_FLANNEL_CACHE /var/cache/ipkeep-flannel "$@"
go_require "flannel from its modules"
flannel=$(version_of github.com/flannel-io/flannel flannel)
plugins=$(version_of github.com/containernetworking/plugins flannel-cni)
cached_build_dir "$cache/flannel$flannel-plugins$plugins-$gover" bin cni

if [ ! -x "$dir/bin/flanneld" ]; then
  command -v gcc >/dev/null || die "gcc is not installed (flanneld's UDP backend builds with cgo): apt-get install gcc"
  go_build "flanneld $flannel" flannel CGO_ENABLED=1 \
    -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$flannel" \
    -o "$dir/bin/flanneld" github.com/flannel-io/flannel
fi
if [ ! -x "$dir/cni/flannel" ]; then
  go_build "flannel CNI plugin (plugins $plugins)" flannel-cni CGO_ENABLED=0 \
    -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$plugins" \
    -o "$dir/cni/flannel" github.com/containernetworking/plugins/plugins/meta/flannel
fi
cached_build_ready "$dir (flanneld $flannel, flannel CNI plugin of plugins $plugins, $gover)"
