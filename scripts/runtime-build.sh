#!/usr/bin/env bash
# Builds the node runtime the real nodes of scripts/cluster.sh run (containerd, its runc shim and
# ctr; runc; the reference CNI plugins, cnitool and our libcni driver) from their published Go modules, into a cache
# outside the repository, and skips whatever is already cached.
#
#   scripts/runtime-build.sh [--cache DIR] [--print-dir] [--only cni-plugins]
#
# The versions are those pinned by the wrapper modules tests/k8s/tools/containerd, runc and
# cni-plugins (go.mod + go.sum, committed; nothing of their source is in this repository). The
# cache is $IPKEEP_RUNTIME_CACHE or --cache (default /var/cache/ipkeep-runtime); the build goes
# in a directory named by the three versions and the Go version, so changing any rebuilds and the
# old build stays until deleted: DIR/bin holds containerd, containerd-shim-runc-v2, ctr, runc,
# cnitool and libcni-driver, DIR/cni the CNI plugins. --print-dir prints DIR (last line).
# Go (>= 1.26), gcc, pkg-config and libseccomp's headers (runc uses cgo; Debian: libseccomp-dev)
# are needed; a cold build takes about 5 minutes on two cores, a warm one (all cached) a second.
# --only cni-plugins builds DIR/cni alone (scripts/release-bundle.sh: the plugins ipkeep's image
# carries), with Go only; a later full build reuses it.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "runtime-build: $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=scripts/lib/go-build.sh
. "$repo/scripts/lib/go-build.sh"

only=
tool_option() {
  case $1 in
    --only) [ "$2" = cni-plugins ] || die "--only takes cni-plugins"; only=$2 ;;
    *) return 1 ;;
  esac
}
cached_build_args IPKEEP_RUNTIME_CACHE /var/cache/ipkeep-runtime "$@"
go_require "the node runtime from its modules"
containerd=$(version_of github.com/containerd/containerd/v2 containerd)
runc=$(version_of github.com/opencontainers/runc runc)
plugins=$(version_of github.com/containernetworking/plugins cni-plugins)
cni=$(version_of github.com/containernetworking/cni cni-plugins)
cached_build_dir "$cache/containerd$containerd-runc$runc-plugins$plugins-cni$cni-$gover" bin cni

# containerd as its Makefile builds it: the version stamps, no cgo (so no btrfs snapshotter,
# which needs libbtrfs; the nodes use overlayfs), and neither devmapper nor zfs (unused). The
# shim is static and without gRPC, as upstream ships it.
cpkg=github.com/containerd/containerd/v2
cldf="-s -w -X $cpkg/version.Version=$containerd -X $cpkg/version.Revision=module -X $cpkg/version.Package=$cpkg"
ctags=urfave_cli_no_docs,no_btrfs,no_devmapper,no_zfs
# The reference CNI plugins the nodes and the tests use (static, as upstream releases them); the
# Dockerfile's plugin stage builds bridge, portmap and loopback the same way.
ppkg=github.com/containernetworking/plugins/plugins
pldf="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$plugins"
pkgs=()
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
  [ -x "$dir/cni/${p#*/}" ] || pkgs+=("$ppkg/$p")
done
if [ ${#pkgs[@]} -gt 0 ]; then
  go_build "CNI plugins $plugins" cni-plugins CGO_ENABLED=0 -ldflags "$pldf" -o "$dir/cni/" "${pkgs[@]}"
fi
if [ "$only" = cni-plugins ]; then
  cached_build_ready "$dir/cni (CNI plugins $plugins, $gover)"
  exit 0
fi
missing=()
for b in containerd ctr; do [ -x "$dir/bin/$b" ] || missing+=("$cpkg/cmd/$b"); done
if [ ${#missing[@]} -gt 0 ]; then
  go_build "containerd, ctr $containerd" containerd CGO_ENABLED=0 -tags="$ctags" -ldflags "$cldf" -o "$dir/bin/" "${missing[@]}"
fi
if [ ! -x "$dir/bin/containerd-shim-runc-v2" ]; then
  go_build "containerd-shim-runc-v2 $containerd" containerd CGO_ENABLED=0 -tags="$ctags,no_grpc" -ldflags "$cldf" \
    -o "$dir/bin/containerd-shim-runc-v2" "$cpkg/cmd/containerd-shim-runc-v2"
fi
# runc as its Makefile builds it (cgo, seccomp), except the libpathrs tag: that library (Rust,
# C ABI) is not packaged by Debian 12; without the tag runc uses its Go fallback (pathrs-lite).
if [ ! -x "$dir/bin/runc" ]; then
  command -v gcc >/dev/null || die "gcc is not installed (runc builds with cgo): apt-get install gcc"
  pkg-config --exists libseccomp 2>/dev/null ||
    die "libseccomp's headers are missing (runc's seccomp support): apt-get install libseccomp-dev pkg-config (or scripts/install-deps.sh)"
  go_build "runc $runc" runc CGO_ENABLED=1 -tags=seccomp,urfave_cli_no_docs -ldflags "-s -w -X main.gitCommit=module" \
    -o "$dir/bin/runc" github.com/opencontainers/runc
fi
if [ ! -x "$dir/bin/cnitool" ]; then
  go_build "cnitool $cni" cni-plugins CGO_ENABLED=0 -ldflags "-s -w" -o "$dir/bin/cnitool" github.com/containernetworking/cni/cnitool
fi
# Our libcni driver (the wrapper module's libcni-driver/): CNI operations through libcni as a
# runtime makes them, GC with valid attachments included (cnitool passes none). Our own source,
# so built every time (a second, from Go's build cache): never a stale copy. Renamed into place,
# so that a test running it meanwhile never sees half a binary.
go_build "libcni-driver (libcni $cni)" cni-plugins CGO_ENABLED=0 -ldflags "-s -w" -o "$dir/bin/.libcni-driver.$$" ./libcni-driver
mv -f "$dir/bin/.libcni-driver.$$" "$dir/bin/libcni-driver"
cached_build_ready "$dir (containerd $containerd, runc $runc, CNI plugins $plugins, cnitool $cni, $gover)"
