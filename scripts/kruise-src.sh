#!/usr/bin/env bash
# Prints the path of OpenKruise v1.9.0's source archive, checked against its SHA-256: the
# archive $IPKEEP_KRUISE_SRC names, else the copy cached in /var/cache/ipkeep-kruise/src
# ($IPKEEP_KRUISE_CACHE), else one fetched from GitHub into that cache. Kruise's Go module is
# not served by the module proxies ipkeep builds with, so its source comes as this archive; the
# tests read Kruise's own CRDs from it (controller/tests/kruise.rs) and kruise-manager is built
# from it. Offline, fetch https://github.com/openkruise/kruise/archive/refs/tags/v1.9.0.tar.gz
# elsewhere and pass it: IPKEEP_KRUISE_SRC=/path/to/kruise-v1.9.0.tar.gz.
set -euo pipefail

version=v1.9.0
sha256=ca079d6477f6c600930552a185f4439a79e45189c54bff1a32969ed4eec1086b
url=https://github.com/openkruise/kruise/archive/refs/tags/$version.tar.gz
cache=${IPKEEP_KRUISE_CACHE:-/var/cache/ipkeep-kruise}/src
die() { echo "kruise-src: $*" >&2; exit 1; }
check() {
  [ -f "$1" ] || die "$1 does not exist (IPKEEP_KRUISE_SRC names OpenKruise $version's source archive, $url)"
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$sha256" ] || die "$1 has SHA-256 $got, not OpenKruise $version's $sha256 ($url)"
}

if [ -n "${IPKEEP_KRUISE_SRC:-}" ]; then
  check "$IPKEEP_KRUISE_SRC"
  echo "$IPKEEP_KRUISE_SRC"
  exit 0
fi
archive=$cache/kruise-$version.tar.gz
if [ ! -f "$archive" ]; then
  mkdir -p "$cache"
  echo "kruise-src: fetching $url" >&2
  curl -fsSL --retry 3 -o "$archive.part" "$url" ||
    die "could not fetch $url: set IPKEEP_KRUISE_SRC to a copy of it"
  mv "$archive.part" "$archive"
fi
check "$archive"
echo "$archive"
