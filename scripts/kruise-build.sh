#!/usr/bin/env bash
# Builds OpenKruise's kruise-manager (for `scripts/cluster.sh up --with-kruise`) from Kruise's
# source archive as the main module, with its dependencies from the Go module proxy, into a cache
# outside the repository, and skips the build when it is already there.
#
#   scripts/kruise-build.sh [ARCHIVE] [--cache DIR] [--print-dir]
#
# ARCHIVE is the source archive of the Kruise release scripts/kruise-src.sh pins (v1.9.0: the
# GitHub archive of the tag, https://github.com/openkruise/kruise/archive/refs/tags/v1.9.0.tar.gz);
# without it, the one scripts/kruise-src.sh finds ($IPKEEP_KRUISE_SRC, its cache, or fetched).
# Either way scripts/kruise-src.sh checks it against the sha256 it records, and a mismatch stops
# the build. The Go module proxy does not serve Kruise's own module (github.com/openkruise/kruise),
# but serves every module its go.mod and go.sum pin, so the archive is unpacked and built with
# `go build ./main.go` (CGO off), as Kruise's Dockerfile builds its manager. Nothing of Kruise is in this repository. The cache is
# $IPKEEP_KRUISE_CACHE or --cache (default /var/cache/ipkeep-kruise); the build goes in a
# directory named by the Kruise and Go versions: DIR/bin/kruise-manager, DIR/crd (Kruise's
# CustomResourceDefinitions, config/crd/bases of the archive) and DIR/webhook/manifests.yaml (its
# webhook configurations, config/webhook). --print-dir prints DIR (last line).
# Go (>= 1.23) is needed; a cold build (its modules, about 540 MB, downloaded from the proxy, Go's
# build cache empty) takes 3.5 to 4.5 minutes on two cores, a warm one (all cached) 0.02 s.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "kruise-build: $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=scripts/lib/go-build.sh
. "$repo/scripts/lib/go-build.sh"

# The release and its archive's sha256 are scripts/kruise-src.sh's (one place to change them).
kruise=$(sed -n 's/^version=//p' "$repo/scripts/kruise-src.sh")
[[ $kruise =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "scripts/kruise-src.sh has no version=vX.Y.Z line"

archive=
case ${1:-} in
  ''|-*) ;;
  *) archive=$1; shift ;;
esac
cached_build_args IPKEEP_KRUISE_CACHE /var/cache/ipkeep-kruise "$@"
if [ -n "$archive" ]; then
  IPKEEP_KRUISE_SRC=$archive "$repo/scripts/kruise-src.sh" >/dev/null || die "$archive is not Kruise $kruise's source archive"
else
  archive=$("$repo/scripts/kruise-src.sh") || die "no source archive of Kruise $kruise found (pass its path)"
fi
go_require "kruise-manager from Kruise's source"
cached_build_dir "$cache/kruise$kruise-$gover" bin

if [ ! -x "$dir/bin/kruise-manager" ] || [ ! -d "$dir/crd" ] || [ ! -f "$dir/webhook/manifests.yaml" ]; then
  # Unpacked afresh each build (a half-unpacked tree from a killed build is never reused), and
  # removed after: only the manager, the CRDs and the webhooks' manifest are kept.
  src=$dir/src
  rm -rf "$src"
  mkdir -p "$src"
  say "unpacking $archive"
  tar -xzf "$archive" -C "$src" --strip-components=1 || die "cannot unpack $archive"
  [ -f "$src/main.go" ] && [ -d "$src/config/crd/bases" ] && [ -f "$src/config/webhook/manifests.yaml" ] ||
    die "$archive has no main.go, config/crd/bases and config/webhook/manifests.yaml at its top: not Kruise's source archive"
  if [ ! -x "$dir/bin/kruise-manager" ]; then
    # GOTOOLCHAIN=local: Kruise's go.mod asks for an older Go, never a download; GOWORK=off: a
    # go.work around the cache must not take part; GOFLAGS=-mod=readonly: its go.sum as it is.
    go_build "kruise-manager $kruise" "$src" "CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly" \
      -ldflags "-s -w" -o "$dir/bin/kruise-manager.tmp" ./main.go
    mv "$dir/bin/kruise-manager.tmp" "$dir/bin/kruise-manager"
  fi
  rm -rf "$dir/crd" "$dir/webhook"
  cp -r "$src/config/crd/bases" "$dir/crd.tmp"
  mv "$dir/crd.tmp" "$dir/crd"
  mkdir -p "$dir/webhook.tmp"
  cp "$src/config/webhook/manifests.yaml" "$dir/webhook.tmp/"
  mv "$dir/webhook.tmp" "$dir/webhook"
  chmod -R u+w "$src"
  rm -rf "$src"
fi
cached_build_ready "$dir (kruise-manager $kruise, its CRDs in crd/, webhooks in webhook/, $gover)"
