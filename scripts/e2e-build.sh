#!/usr/bin/env bash
# Builds Kubernetes' own end-to-end suite, e2e.test (the sig-apps and sig-network tests only), and
# agnhost (the image most of those tests run), from k8s.io/kubernetes of the cluster's release, into
# the same cache as scripts/k8s-build.sh, and skips whatever is already built.
#
#   scripts/e2e-build.sh [--k8s-version V] [--cache DIR] [--print-dir]
#
# The wrapper module is tests/k8s/tools/e2e/VERSION/ (go.mod + go.sum + e2e_test.go, committed;
# nothing of Kubernetes' source is in this repository). The binaries go in
# CACHE/e2e-VERSION-GOVERSION/ (e2e.test, agnhost); --print-dir prints that directory (last line).
# The build shares Go's build cache with scripts/k8s-build.sh (same flags), so after the cluster's
# binaries it compiles only the test framework and tests: about 10 minutes cold on two cores, under
# two seconds warm.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
k8s=${IPKEEP_K8S_VERSION:-v1.37.2}
say() { echo "e2e-build: $*" >&2; }
die() { say "error: $*"; exit 1; }
tool_option() {
  case $1 in
    --k8s-version) k8s=${2:?--k8s-version needs a release such as v1.37.2} ;;
    *) return 1 ;;
  esac
}
# shellcheck source=scripts/lib/go-build.sh
. "$repo/scripts/lib/go-build.sh"

cached_build_args IPKEEP_K8S_CACHE /var/cache/ipkeep-k8s "$@"
go_require "e2e.test from k8s.io/kubernetes"
wrapper=$tools/e2e/$k8s
[ -f "$wrapper/go.mod" ] ||
  die "no e2e wrapper module for Kubernetes '$k8s' (have: $(for d in "$tools"/e2e/v*/; do basename "$d"; done | paste -sd ' ')); copy tests/k8s/tools/e2e/v1.37.2 and run go mod tidy in it"
pinned=$(version_of k8s.io/kubernetes "e2e/$k8s")
[ "$pinned" = "$k8s" ] || die "tests/k8s/tools/e2e/$k8s/go.mod requires k8s.io/kubernetes $pinned, not $k8s"
cached_build_dir "$cache/e2e-$k8s-$gover"

# The flags and version stamps of scripts/k8s-build.sh, so both share Go's build cache and the
# suite reports the release it was built from.
minor=${k8s#v1.}; minor=${minor%%.*}
ldf="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldf="$ldf -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
flags=("-tags=selinux,notest" -ldflags "$ldf")

if [ ! -x "$dir/e2e.test" ]; then
  # `go test -c` prints nothing while it compiles; `go build -v` of the same packages first shows
  # progress and leaves every package in the build cache, so the test link that follows is quick.
  mapfile -t deps < <(cd "$wrapper" && go list -f '{{join .Imports "\n"}}' -test . 2>/dev/null | grep '^k8s.io/kubernetes/test/' | sort -u)
  [ ${#deps[@]} -gt 0 ] || die "go list found no test packages in $wrapper"
  go_build "e2e test packages $k8s" "e2e/$k8s" CGO_ENABLED=0 "${flags[@]}" "${deps[@]}"
  go_run "e2e.test $k8s" "e2e/$k8s" CGO_ENABLED=0 test -c -vet=off -trimpath -buildvcs=false "${flags[@]}" \
    -o "$dir/e2e.test.tmp" .
  mv "$dir/e2e.test.tmp" "$dir/e2e.test"
fi
if [ ! -x "$dir/agnhost" ]; then
  go_build "agnhost $k8s" "e2e/$k8s" CGO_ENABLED=0 "${flags[@]}" -o "$dir/agnhost.tmp" k8s.io/kubernetes/test/images/agnhost
  mv "$dir/agnhost.tmp" "$dir/agnhost"
fi
cached_build_ready "$dir (e2e.test and agnhost of kubernetes $k8s)"
