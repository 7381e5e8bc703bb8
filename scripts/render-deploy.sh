#!/usr/bin/env bash
# Renders the plain manifests in deploy/ from the Helm chart charts/ipkeep, the one source of
# ipkeep's manifests (`helm template` with the chart's default values; the renderings and their
# few extra values are listed in scripts/render_deploy.py). Every rendered YAML file starts with
# a comment naming its chart file; deploy/cni/10-ipkeep-bridge.conflist (JSON, no comments) is
# the chart's CNI template. Hand-kept in deploy/: README.md, the kustomization.yaml files,
# cni/10-ipkeep-flannel.conflist, scheduler-ext/make-certificate.sh and examples/.
#
#   scripts/render-deploy.sh           # rewrite deploy/ (then commit it)
#   scripts/render-deploy.sh --check   # fail, naming each file, when deploy/ is stale
#
# helm: $IPKEEP_HELM, else the one scripts/helm-build.sh builds (cached; the first build takes
# a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

check=""
case "${1:-}" in
  "") ;;
  --check) check=--check ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "render-deploy: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

helm="${IPKEEP_HELM:-}"
if [ -z "$helm" ]; then
  helm="$(scripts/helm-build.sh --print-dir | tail -1)/bin/helm"
fi
[ -x "$helm" ] || { echo "render-deploy: $helm is not an executable helm" >&2; exit 2; }
exec python3 scripts/render_deploy.py "$helm" charts/ipkeep deploy $check
