#!/usr/bin/env bash
# Offline validation of what a cluster admin applies: the Helm chart charts/ipkeep and deploy/
# (or the directory given).
#
# With a helm ($IPKEEP_HELM; scripts/test.sh passes the one scripts/helm-build.sh builds), first
# the chart:
#  - `helm lint --strict` with the default values and with charts/ipkeep/ci/*.yaml;
#  - values.schema.json (and the templates' cross-field checks) refuse a few bad values, each
#    with a message naming the key;
#  - deploy/ is what scripts/render-deploy.sh renders from the chart now (else it fails naming
#    each stale file; the fix is `scripts/render-deploy.sh`);
#  - (with or without a helm) the values table in charts/ipkeep/README.md is what
#    scripts/values_table.py generates (the fix: run it);
#  - the chart rendered with the default values and with each charts/ipkeep/ci/*.yaml (into
#    another namespace) passes every check below, as deploy/ does.
# Without a helm these are skipped, saying so.
#
# The checks of each directory are scripts/validate_deploy.py; this script makes its
# virtualenv and runs it:
#
#  1. every *.yaml / *.yml parses (PyYAML, duplicate keys refused) and every document is an
#     object with apiVersion and kind; every *.conflist is JSON (duplicate keys refused) with
#     the shape libcni needs, and its ipkeep IPAM gets the pod-annotations capability;
#  2. every Kubernetes API object is checked by kubernetes-validate in strict mode (unknown
#     fields are errors) against the Kubernetes versions in K8S_VERSIONS;
#  3. what kubernetes-validate has no schema for is handled explicitly, never silently:
#     - PersistentPodState (ipkeep.dev) is checked against the openAPIV3Schema of the CRD in the
#       same directory, with unknown fields refused (as `kubectl apply` does by default);
#     - KubeSchedulerConfiguration is a kube-scheduler file, not an API object: its top-level
#       and extender fields are checked against a small hand-written list of the v1 fields;
#     - Kustomization: every listed resource must exist, and `kubectl kustomize` must render it;
#     - kustomize Component (cni/): its files must exist, and the directory with the component
#       must render into objects that pass the same strict validation, and (with a helm) its
#       agent DaemonSet must be the chart's with cni.enabled=true;
#     - a ConfigMap's *.conflist (the chart's CNI template) is checked like a conflist file;
#     (the renderings use the kubectl of the cluster build, $IPKEEP_KUBECTL, which
#     scripts/test.sh passes; without it they are skipped, never run with another kubectl);
#     - cert-manager Issuer/Certificate: skipped with a reason (cert-manager's CRDs cannot be
#       fetched offline), after a check of the fields deploy/ relies on;
#     - PrometheusRule (monitoring.coreos.com): its fields checked by hand (groups, rules with
#       alert, expr, for, labels, annotations, nothing else) and every expr parsed as PromQL
#       (promql-parser, the Rust parser of GreptimeDB's, pinned below); with a promtool
#       ($IPKEEP_PROMTOOL; scripts/test.sh passes the one scripts/promtool-build.sh builds) also
#       `promtool check rules` on its groups and `promtool test rules` with
#       tests/monitoring/alerts-test.yaml, else skipped saying so;
#     - a ConfigMap's *.json (the Grafana dashboard) is JSON whose panel queries parse as PromQL;
#     - any other kind without a schema is an error.
#
# Exits non-zero, saying which file, document and field, when anything is invalid. Needs
# python3 with venv (scripts/install-deps.sh installs python3-venv) and, the first time, PyPI:
# the pinned tools go into a virtualenv under target/ (IPKEEP_VALIDATE_VENV overrides).
#
#   scripts/validate-deploy.sh              # deploy/
#   scripts/validate-deploy.sh /tmp/broken  # any directory laid out like deploy/
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${1:-deploy}"
[ -d "$dir" ] || { echo "validate-deploy: $dir is not a directory" >&2; exit 2; }

# kubernetes-validate bundles the Kubernetes OpenAPI schemas of 1.25 to 1.37. 1.35 is the oldest
# release the chart (kubeVersion) and docs/install.md support (a field added later fails there),
# 1.33 the API our code is built against (k8s-openapi feature v1_33), 1.37 the newest bundled (a
# field removed since fails).
K8S_VERSIONS="${K8S_VERSIONS:-1.33 1.35 1.37}"
REQUIREMENTS="kubernetes-validate==1.37.0 jsonschema==4.26.0 referencing==0.37.0 PyYAML==6.0.3 promql-parser==0.11.0"

venv="${IPKEEP_VALIDATE_VENV:-$PWD/target/validate-deploy-venv}"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements" 2>/dev/null)" != "$REQUIREMENTS" ]; then
  rm -rf "$venv"
  made=""
  # Debian's python3 needs python3-venv for this; a pyenv or other python3 has venv built in.
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null && "$py" -m venv "$venv" >/dev/null 2>&1; then
      made=1
      break
    fi
    rm -rf "$venv"
  done
  if [ -z "$made" ]; then
    echo "validate-deploy: cannot create a Python virtualenv; install python3-venv" \
      "(scripts/install-deps.sh does, as root)" >&2
    exit 2
  fi
  echo "validate-deploy: installing $REQUIREMENTS into $venv" >&2
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --quiet --disable-pip-version-check $REQUIREMENTS
  echo "$REQUIREMENTS" >"$venv/.requirements"
fi

# The kubectl of the cluster build (scripts/k8s-build.sh; scripts/test.sh passes it), never
# one that happens to be installed: without it the kustomize renderings are skipped. Likewise
# helm: the one of scripts/helm-build.sh, never another.
kubectl_bin="${IPKEEP_KUBECTL:-}"
helm_bin="${IPKEEP_HELM:-}"
promtool_bin="${IPKEEP_PROMTOOL:-}"
if [ -n "$promtool_bin" ] && [ ! -x "$promtool_bin" ]; then
  echo "validate-deploy: IPKEEP_PROMTOOL=$promtool_bin is not executable" >&2
  exit 2
fi
chart=charts/ipkeep
# The chart README's values table is what scripts/values_table.py generates from values.yaml
# and values.schema.json (it needs PyYAML, which the virtualenv has).
"$venv/bin/python" scripts/values_table.py --check
validate() { # the checks of one directory: scripts/validate_deploy.py
  K8S_VERSIONS="$K8S_VERSIONS" KUBECTL="$kubectl_bin" HELM="$helm_bin" CHART="$chart" \
    PROMTOOL="$promtool_bin" "$venv/bin/python" scripts/validate_deploy.py "$1"
}

if [ -z "$helm_bin" ]; then
  echo "validate-deploy: SKIP the chart $chart (lint, schema, renderings, deploy/ stale or not):" \
    "no IPKEEP_HELM (scripts/helm-build.sh builds one; scripts/test.sh passes it)"
else
  [ -x "$helm_bin" ] || { echo "validate-deploy: IPKEEP_HELM=$helm_bin is not executable" >&2; exit 2; }
  rendered=$(mktemp -d)
  trap 'rm -rf "$rendered"' EXIT
  "$helm_bin" lint --strict "$chart" --namespace ipkeep-system
  "$helm_bin" template ipkeep "$chart" --namespace ipkeep-system \
    >"$rendered/chart-default-values.yaml"
  ci_values=0
  for values in "$chart"/ci/*.yaml; do
    ci_values=$((ci_values + 1))
    "$helm_bin" lint --strict "$chart" --namespace ipkeep-other -f "$values"
    "$helm_bin" template ipkeep "$chart" --namespace ipkeep-other -f "$values" \
      >"$rendered/chart-$(basename "$values")"
  done
  # The schema refuses bad values, saying which key and why.
  for bad in "webhook.failurePolicy=Fial|/webhook/failurePolicy" \
             "webhook.timeoutSeconds=31|/webhook/timeoutSeconds" \
             "networkPolicy.enabled=true|/networkPolicy/controlPlaneCIDRs" \
             "cni.ipam.retention=5 minutes|/cni/ipam/retention" \
             "controler.replicas=2|additional properties 'controler'" \
             "cni.ranges[0][0].subnet=banana|/cni/ranges/0/0/subnet" \
             "schedulerExt.service.clusterIP=999.1.1.1|/schedulerExt/service/clusterIP" \
             "selfManagedCertificates.caValidity=1h|caValidity"; do
    if out=$("$helm_bin" template ipkeep "$chart" --set "${bad%%|*}" 2>&1 >/dev/null); then
      echo "validate-deploy: FAIL: the chart accepts --set ${bad%%|*}; values.schema.json must refuse it" >&2
      exit 1
    elif [[ "$out" != *"${bad#*|}"* ]]; then
      echo "validate-deploy: FAIL: --set ${bad%%|*} is refused, but the message does not name ${bad#*|}: $out" >&2
      exit 1
    fi
  done
  echo "validate-deploy: ok   $chart: helm lint --strict (default values, $ci_values ci values files), schema and templates refuse 8 bad values"
  if [ "$dir" = deploy ]; then
    IPKEEP_HELM="$helm_bin" scripts/render-deploy.sh --check
  fi
  echo "validate-deploy: the chart's renderings ($rendered)"
  validate "$rendered"
fi
validate "$dir"
