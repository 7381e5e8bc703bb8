#!/usr/bin/env bash
# The release bundle: everything a cluster admin installs ipkeep from, without this repository
# (docs/install.md, "1. The release bundle"), built from a clean checkout in one go:
#
#   scripts/release-bundle.sh OUTDIR [--allow-dirty] [--release-dir DIR --plugin PATH]
#                                    [--push REGISTRY]
#
# OUTDIR (new, or empty) then holds:
#   ipkeep-VERSION.tgz       the Helm chart (`helm package charts/ipkeep`)
#   ipkeep-image.tar         the image, an OCI image-layout archive (linux/amd64) named
#                            ghcr.io/ipkeep/ipkeep:VERSION, the chart's default image: what the
#                            Dockerfile builds, made without Docker by scripts/images.py from
#                            the release build, the static plugin and the reference CNI plugins
#                            1.10.0 (scripts/runtime-build.sh --only cni-plugins)
#   bin/ipkeep               the CNI plugin and admin tool, statically linked
#                            (scripts/build-plugin.sh)
#   crd.yaml                 the PersistentPodState CRD (deploy/crd.yaml; the chart installs
#                            and upgrades it itself unless crds.manage=false)
#   namespace.yaml           the namespace with its Pod Security labels (deploy/namespace.yaml)
#   sbom/BINARY.cdx.json     a CycloneDX 1.5 SBOM of each binary's Rust crates (ipkeep,
#                            ipkeep-agent, ipkeep-controller, ipkeep-scheduler-ext), by
#                            cargo-cyclonedx (scripts/cargo-cyclonedx-build.sh)
#   sbom/cni-plugins.txt     the Go modules of the image's reference CNI plugins (go version -m)
#   sbom/image-base.txt      what else the image takes from the build machine (the C library,
#                            busybox, bash, CA certificates: their Debian packages)
#   RELEASE                  the version, the commit, the image's digest, the tools
#   SHA256SUMS               every file above (`sha256sum -c SHA256SUMS` in OUTDIR)
#
# The work tree must be clean (every file committed: the bundle is that commit), unless
# --allow-dirty (RELEASE then says so). The release binaries are built here (cargo build
# --release of the agent, the controller and scheduler-ext; scripts/build-plugin.sh), unless
# --release-dir and --plugin name ones built already (scripts/cluster.sh passes its own).
#
# Publishing needs a registry this machine cannot reach: --push REGISTRY (after the bundle is
# made) copies the image to REGISTRY/ipkeep:VERSION with skopeo (or crane) and the chart to
# oci://REGISTRY/charts with `helm push`, using your credentials (skopeo login, helm registry
# login); install with image.repository=REGISTRY/ipkeep. It has not been run against a registry
# here.
#
# Needs cargo, Go (the CNI plugins; helm, from scripts/helm-build.sh), python3 and git.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "release-bundle: $*" >&2; }
die() { say "error: $*"; exit 1; }

out= allow_dirty=0 release_dir= plugin= push=
while [ $# -gt 0 ]; do
  case $1 in
    --allow-dirty) allow_dirty=1; shift ;;
    --release-dir) release_dir=${2:?--release-dir needs a directory}; shift 2 ;;
    --plugin) plugin=${2:?--plugin needs the path of the static plugin}; shift 2 ;;
    --push) push=${2:?--push needs a registry, e.g. registry.example.com/platform}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown argument '$1' (see --help)" ;;
    *) [ -z "$out" ] || die "one OUTDIR only (see --help)"; out=$1; shift ;;
  esac
done
[ -n "$out" ] || die "usage: $0 OUTDIR [--allow-dirty] [--release-dir DIR --plugin PATH] [--push REGISTRY]"
if [ -n "$release_dir" ] || [ -n "$plugin" ]; then
  [ -n "$release_dir" ] && [ -n "$plugin" ] || die "--release-dir and --plugin go together"
fi
if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then
  die "$out is not empty: give a new or empty directory"
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"

# --- what is being released -----------------------------------------------------------------

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
chart_version=$(sed -n 's/^version: //p' charts/ipkeep/Chart.yaml)
app_version=$(sed -n 's/^appVersion: "\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/ipkeep/Chart.yaml)
[ -n "$version" ] || die "no [workspace.package] version in Cargo.toml"
[ "$chart_version" = "$version" ] && [ "$app_version" = "$version" ] ||
  die "Cargo.toml says $version, charts/ipkeep/Chart.yaml version $chart_version and appVersion $app_version: one version for everything (CHANGELOG.md)"
commit=$(git rev-parse HEAD 2>/dev/null) || die "$repo is not a git checkout"
dirty=$(git status --porcelain --untracked-files=normal)
if [ -n "$dirty" ]; then
  [ "$allow_dirty" = 1 ] ||
    die "the work tree has changes not committed (git status): a bundle is one commit; commit them, or pass --allow-dirty for a bundle you will not publish"
  commit="$commit-dirty"
fi
image=ghcr.io/ipkeep/ipkeep:$version
say "ipkeep $version from $commit into $out"

# --- binaries ---------------------------------------------------------------------------------

# shellcheck source=scripts/lib/cargo-env.sh
. scripts/lib/cargo-env.sh
drop_test_cargo_env
if [ -z "$release_dir" ]; then
  say "building the release binaries (cargo build --release)"
  # Each package's binary of its own name, as scripts/cluster.sh builds them.
  cargo_build "release-bundle: cargo build" --locked --release \
    -p ipkeep-agent --bin ipkeep-agent -p ipkeep-controller --bin ipkeep-controller \
    -p ipkeep-scheduler-ext --bin ipkeep-scheduler-ext || die "cargo build --release failed"
  release_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release
  say "building the static plugin (scripts/build-plugin.sh)"
  plugin=$(scripts/build-plugin.sh | tail -1) || die "scripts/build-plugin.sh failed"
fi
[ -x "$plugin" ] || die "$plugin is not an executable"
say "the reference CNI plugins (scripts/runtime-build.sh --only cni-plugins)"
cni=$(scripts/runtime-build.sh --only cni-plugins --print-dir | tail -1)/cni || die "scripts/runtime-build.sh failed"
helm=$(scripts/helm-build.sh --print-dir | tail -1)/bin/helm || die "scripts/helm-build.sh failed"

mkdir -p "$out/bin" "$out/sbom"
install -m 0755 "$plugin" "$out/bin/ipkeep"

# --- the image --------------------------------------------------------------------------------

say "the image $image (scripts/images.py)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 scripts/images.py --only ipkeep --release-dir "$release_dir" --plugin "$plugin" \
  --cni-plugins "$cni" --ipkeep-ref "$image" --out "$work/images" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$commit" \
  --label "org.opencontainers.image.source=https://github.com/ipkeep/ipkeep" \
  --label "org.opencontainers.image.licenses=Apache-2.0" >"$work/images.txt" || die "scripts/images.py failed"
mv "$work/images/ipkeep.tar" "$out/ipkeep-image.tar"
digest=$(awk '{print $3}' "$work/images.txt")

# --- the chart, the CRD, the namespace --------------------------------------------------------

say "the chart (helm package), the CRD and the namespace (deploy/, checked against the chart)"
IPKEEP_HELM=$helm scripts/render-deploy.sh --check >/dev/null ||
  die "deploy/ is not what the chart renders: scripts/render-deploy.sh, then commit"
"$helm" package charts/ipkeep --destination "$out" >/dev/null || die "helm package failed"
[ -f "$out/ipkeep-$version.tgz" ] || die "helm package wrote no ipkeep-$version.tgz"
cp deploy/crd.yaml "$out/crd.yaml"
cp deploy/namespace.yaml "$out/namespace.yaml"

# --- the SBOM ---------------------------------------------------------------------------------

say "the SBOMs (cargo-cyclonedx)"
cyclonedx=$(scripts/cargo-cyclonedx-build.sh --print-dir | tail -1)/bin/cargo-cyclonedx ||
  die "scripts/cargo-cyclonedx-build.sh failed"
# cargo-cyclonedx writes each SBOM next to its package's Cargo.toml: it runs on a copy of the
# checked-in files, never in the work tree.
mkdir -p "$work/src"
git ls-files -z --cached --others --exclude-standard |
  tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$work/src" ||
  die "copying the work tree for cargo cyclonedx failed"
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) CARGO_NET_OFFLINE=true \
  "$cyclonedx" cyclonedx --manifest-path "$work/src/Cargo.toml" --describe binaries --spec-version 1.5 \
  --format json --no-build-deps -q || die "cargo cyclonedx failed"
for pair in cni/plugin/ipkeep_bin:ipkeep cni/agent/ipkeep-agent_bin:ipkeep-agent \
  controller/ipkeep-controller_bin:ipkeep-controller scheduler-ext/ipkeep-scheduler-ext_bin:ipkeep-scheduler-ext; do
  [ -f "$work/src/${pair%%:*}.cdx.json" ] || die "cargo cyclonedx wrote no ${pair%%:*}.cdx.json"
  cp "$work/src/${pair%%:*}.cdx.json" "$out/sbom/${pair#*:}.cdx.json"
done
for p in bridge portmap loopback; do
  go version -m "$cni/$p"
done >"$out/sbom/cni-plugins.txt" || die "go version -m failed"
{
  echo "# What scripts/images.py copies into the image from the machine that built it, besides the"
  echo "# binaries: the C library the binaries link against, busybox (sh, cp, mv, ...), bash (the"
  echo "# helm test pod) and the CA certificates. Debian packages, as dpkg-query lists them."
  dpkg-query -W -f '${Package} ${Version}\n' libc6 busybox-static bash ca-certificates 2>/dev/null ||
    echo "(no dpkg-query on the build machine: see the files' origin in scripts/images.py)"
} >"$out/sbom/image-base.txt"

# --- RELEASE, SHA256SUMS ----------------------------------------------------------------------

cat >"$out/RELEASE" <<EOF
ipkeep $version
commit: $commit
image: $image ($digest, linux/amd64) in ipkeep-image.tar
chart: ipkeep-$version.tgz (appVersion $version)
built: $(date -u +%Y-%m-%dT%H:%M:%SZ) by scripts/release-bundle.sh with $(rustc --version), helm $("$helm" version --short), CNI plugins $(sed -n 's/^\tmod\tgithub.com\/containernetworking\/plugins\t\(\S*\).*/\1/p' "$out/sbom/cni-plugins.txt" | head -1)
EOF
(cd "$out" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
say "done: $(wc -l <"$out/SHA256SUMS") files in $out ($(du -sh "$out" | cut -f1)); check with: (cd $out && sha256sum -c SHA256SUMS)"

# --- publishing -------------------------------------------------------------------------------

if [ -n "$push" ]; then
  say "pushing the image to $push/ipkeep:$version and the chart to oci://$push/charts"
  if command -v skopeo >/dev/null; then
    skopeo copy "oci-archive:$out/ipkeep-image.tar" "docker://$push/ipkeep:$version" || die "skopeo copy failed"
  elif command -v crane >/dev/null; then
    mkdir -p "$work/layout" && tar -xf "$out/ipkeep-image.tar" -C "$work/layout"
    crane push "$work/layout" "$push/ipkeep:$version" || die "crane push failed"
  else
    die "--push needs skopeo or crane to copy the image (the chart alone: $helm push $out/ipkeep-$version.tgz oci://$push/charts)"
  fi
  "$helm" push "$out/ipkeep-$version.tgz" "oci://$push/charts" || die "helm push failed"
  say "pushed: helm install ipkeep oci://$push/charts/ipkeep --version $version --set image.repository=$push/ipkeep"
fi
echo "$out"
