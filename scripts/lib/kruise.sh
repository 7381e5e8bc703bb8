# OpenKruise's kruise-manager in a cluster of scripts/cluster.sh (`up --with-kruise ARCHIVE`;
# sourced after lib/controlplane.sh), for ipkeep's tests of Advanced StatefulSets against the real
# controller:
# - kruise-manager is built from Kruise's source archive by scripts/kruise-build.sh (or found in
#   its cache); Kruise's CustomResourceDefinitions (all of config/crd/bases) are created.
# - it runs on the host as a local process with the admin's kubeconfig, no leader election,
#   feature gates PodWebhook=false (no webhook on every pod, no Kruise PersistentPodState) and
#   KruiseDaemon=false (no kruise-daemon on the nodes); its other controllers, the Advanced
#   StatefulSet one among them, run as they do in a Kruise installation.
# - its webhooks (defaulting and validation of Kruise's own resources: without the defaults its
#   StatefulSet controller panics on nil fields) are reached by kube-apiserver at a URL on
#   loopback, https://127.0.0.1:P+11, as Kruise itself does when WEBHOOK_HOST is set: this script
#   creates the two webhook configurations Kruise expects, kruise-{mutating,validating}-webhook-
#   configuration, empty and with Kruise's own list (config/webhook/manifests.yaml, only the
#   webhooks for resources of Kruise's groups: none for pods, namespaces or built-in workloads)
#   in their `template` annotation; kruise-manager fills them in with the webhooks it serves,
#   each with the URL and the CA's certificate. The serving certificate (127.0.0.1 and localhost,
#   which its own readiness check dials) and its CA are made here, in DIR/kruise/certs in the
#   file layout Kruise's certificate writer reads (CERTS_RENEW_BEFORE=1d: they last 30 days,
#   as the cluster's other certificates, and Kruise would replace any that expire within its
#   default six months).
# - its log is DIR/logs/kruise-manager.log; `down` stops it with the rest. Its probes listen on
#   127.0.0.1:P+12; its metrics and pprof are off. Kruise's webhook server always listens on
#   every address (0.0.0.0:P+11: its host is fixed in Kruise's main.go).
# shellcheck source=scripts/lib/require.sh
. "${BASH_SOURCE[0]%/*}/require.sh"
require_vars repo state port_base kruise_archive say die start wait_for ssl newkey kubectl

p_kruise=$((port_base + 11)) p_kruise_probe=$((port_base + 12))
kruise_dir=

# kruise_build: kruise-manager and Kruise's CRDs built or found (scripts/kruise-build.sh); sets
# kruise_dir.
kruise_build() {
  say "building or reusing kruise-manager (scripts/kruise-build.sh)"
  kruise_dir=$("$repo/scripts/kruise-build.sh" "$kruise_archive" --print-dir | tail -1)
  [ -x "$kruise_dir/bin/kruise-manager" ] || die "scripts/kruise-build.sh left no kruise-manager in $kruise_dir"
}

# kruise_certs: a CA of Kruise's own and its serving certificate, in Kruise's file layout.
kruise_certs() {
  local d=$state/kruise/certs
  mkdir -p "$d"
  newkey "$d/ca-key.pem"
  ssl req -x509 -new -key "$d/ca-key.pem" -days 30 -subj "/CN=kruise-webhook-test-ca" -out "$d/ca-cert.pem"
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" >"$d/server.ext"
  newkey "$d/key.pem"
  ssl req -new -key "$d/key.pem" -subj "/CN=127.0.0.1" -out "$d/server.csr"
  ssl x509 -req -in "$d/server.csr" -CA "$d/ca-cert.pem" -CAkey "$d/ca-key.pem" -CAcreateserial \
    -days 30 -out "$d/cert.pem" -extfile "$d/server.ext"
  rm -f "$d/server.csr" "$d/server.ext" "$d/ca-cert.srl"
  cp "$d/cert.pem" "$d/tls.crt"
  cp "$d/key.pem" "$d/tls.key"
}

# kruise_webhook_configurations: the two configurations, empty, with Kruise's template.
kruise_webhook_configurations() {
  local manifests=$kruise_dir/webhook/manifests.yaml
  [ -f "$manifests" ] || die "no $manifests (rebuild the cache: scripts/kruise-build.sh)"
  "${kubectl[@]}" create --dry-run=client -o json -f "$manifests" | python3 -c '
import json, sys
# kubectl prints one object after another, no list.
text, dec, at, items = sys.stdin.read(), json.JSONDecoder(), 0, []
while text[at:].strip():
    obj, at = dec.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
    items.append(obj)
out = []
for conf in items:
    kind = conf["kind"]
    prefix = "kruise-mutating" if kind.startswith("Mutating") else "kruise-validating"
    # Only what acts on Kruise'"'"'s own resources: the paths of the others name built-in kinds.
    hooks = [w for w in conf["webhooks"]
             if "-kruise-io-" in w["clientConfig"]["service"]["path"]]
    out.append({"apiVersion": conf["apiVersion"], "kind": kind,
                "metadata": {"name": prefix + "-webhook-configuration",
                             "annotations": {"template": json.dumps(hooks)}},
                "webhooks": []})
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": out}))
' >"$state/kruise/webhook-configurations.json" || die "cannot read Kruise's webhooks from $manifests"
  "${kubectl[@]}" create -f "$state/kruise/webhook-configurations.json" >/dev/null || return 1
}

# kruise_crds_established: kube-apiserver serves every one of Kruise's CRDs.
kruise_crds_established() {
  local want got
  want=$(find "$kruise_dir/crd" -name '*.yaml' | wc -l)
  got=$("${kubectl[@]}" get -f "$kruise_dir/crd" \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Established")].status}{"\n"}{end}' | grep -c '^True$')
  [ "$got" -eq "$want" ]
}

# kruise_filled: kube-apiserver has kruise-manager's webhooks (its URL in both configurations).
kruise_filled() {
  local kind
  for kind in mutating validating; do
    "${kubectl[@]}" get "${kind}webhookconfiguration" "kruise-$kind-webhook-configuration" \
      -o jsonpath='{.webhooks[*].clientConfig.url}' | grep -q "https://127.0.0.1:$p_kruise/" || return 1
  done
}

# kruise_up: Kruise's CRDs, certificates and webhook configurations, then kruise-manager; returns
# once its webhooks are registered and it is ready.
kruise_up() {
  local t0; t0=$(date +%s)
  say "starting kruise-manager ($kruise_dir; webhooks on https://127.0.0.1:$p_kruise)"
  mkdir -p "$state/kruise" || die "cannot create $state/kruise"
  # (`|| die` throughout: cluster.sh calls this in an && list, where set -e does not act.)
  "${kubectl[@]}" create namespace kruise-system >/dev/null || die "cannot create the namespace kruise-system"
  # create, not apply: some of Kruise's CRDs are larger than apply's annotation allows.
  "${kubectl[@]}" create -f "$kruise_dir/crd" >/dev/null || die "cannot create Kruise's CRDs ($kruise_dir/crd)"
  wait_for "Kruise's CRDs" 60 "" kruise_crds_established
  kruise_certs || die "cannot make kruise-manager's certificates"
  kruise_webhook_configurations || die "cannot create Kruise's webhook configurations"
  start kruise-manager env KUBECONFIG="$state/admin.kubeconfig" POD_NAMESPACE=kruise-system \
    WEBHOOK_HOST=127.0.0.1 WEBHOOK_PORT="$p_kruise" WEBHOOK_CERT_DIR="$state/kruise/certs" \
    CERTS_RENEW_BEFORE=1d \
    "$kruise_dir/bin/kruise-manager" --enable-leader-election=false --metrics-addr=0 \
    --health-probe-addr="127.0.0.1:$p_kruise_probe" --enable-pprof=false \
    --feature-gates=PodWebhook=false,KruiseDaemon=false
  wait_for "kruise-manager's webhooks registered" 90 kruise-manager kruise_filled
  wait_for "kruise-manager" 60 kruise-manager curl -fsS "http://127.0.0.1:$p_kruise_probe/readyz"
  say "  kruise-manager up in $(( $(date +%s) - t0 )) s"
}
