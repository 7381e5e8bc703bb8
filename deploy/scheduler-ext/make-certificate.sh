#!/usr/bin/env bash
# TLS for ipkeep-scheduler-ext without cert-manager: makes a private CA (or reuses the one in
# DIR), signs a serving certificate for the Service, stores it in the Secret
# ipkeep-scheduler-ext-tls, puts the CA into both webhook configurations' caBundle, and leaves
# the CA in DIR/ca.crt for kube-scheduler's extender (tlsConfig.caFile).
#
#   deploy/scheduler-ext/make-certificate.sh [--out DIR] [--days N] [--cluster-ip IP]
#                                            [--kubectl PATH] [--files-only]
#
#   --out DIR         where the CA and the certificate go (default ./ipkeep-scheduler-ext-pki);
#                     keep ca.key safe: run the script again with the same DIR to renew the
#                     serving certificate under the same CA (nothing to change in kube-scheduler)
#   --days N          the serving certificate's lifetime (default 365; the CA's is 10 years)
#   --cluster-ip IP   also name this IP (the Service's fixed clusterIP, when kube-scheduler
#                     calls the extender by IP because it cannot resolve *.svc)
#   --kubectl PATH    the kubectl to use (default: kubectl on PATH), with its usual KUBECONFIG
#   --files-only      make the files only; touch nothing in the cluster
#
# Run it after `kubectl apply -k deploy/` (the namespace and the webhook configurations must
# exist). The scheduler-ext pods pick the Secret up by themselves (they stay ContainerCreating
# until it exists, and reload renewed files within --cert-reload-interval). Needs openssl.
#
# Keys are ECDSA P-256 (kube-apiserver's and kube-scheduler's Go TLS take it). The CA can sign
# nothing but end certificates for this Service's names: basicConstraints CA:TRUE with
# pathlen:0, keyUsage keyCertSign and cRLSign, and name constraints that permit only the
# Service's DNS names (so the CA's key, if it leaks, signs no certificate another client would
# trust for another name). A CA already in DIR is reused as it is: to get one with these
# constraints (after an earlier version made an RSA CA without them), use a new DIR, and give
# kube-scheduler and the webhooks the new ca.crt.
set -euo pipefail

ns=ipkeep-system
svc=ipkeep-scheduler-ext
secret=ipkeep-scheduler-ext-tls
webhook=ipkeep-scheduler-ext
out=./ipkeep-scheduler-ext-pki
days=365
cluster_ip=
kubectl=kubectl
files_only=0

say() { echo "make-certificate: $*" >&2; }
die() { say "error: $*"; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --days) days=${2:?--days needs a number}; shift 2 ;;
    --cluster-ip) cluster_ip=${2:?--cluster-ip needs an address}; shift 2 ;;
    --kubectl) kubectl=${2:?--kubectl needs a path}; shift 2 ;;
    --files-only) files_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $days =~ ^[0-9]+$ ]] && [ "$days" -gt 0 ] || die "--days must be a positive number of days"
# is_ip TEXT: whether TEXT is an IPv4 address (four decimal octets) or an IPv6 address.
is_ip() {
  local ip=$1 octet
  if [[ $ip =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]]; then
    for octet in "${BASH_REMATCH[@]:1}"; do
      [[ $octet =~ ^(0|[1-9][0-9]*)$ ]] && [ "$octet" -le 255 ] || return 1
    done
    return 0
  fi
  # IPv6: hex groups of 1-4 digits, at most 8, "::" at most once (no IPv4 tail: a Service's
  # cluster IP is never written so).
  [[ $ip =~ ^[0-9a-fA-F:]+$ ]] && [[ $ip == *:* ]] || return 1
  local rest=${ip//::/} groups
  [ $(( (${#ip} - ${#rest}) / 2 )) -le 1 ] || return 1
  [[ $ip != *:::* ]] || return 1
  IFS=: read -ra groups <<<"$ip"
  local g n=0
  for g in "${groups[@]}"; do
    [ -z "$g" ] && continue
    [[ $g =~ ^[0-9a-fA-F]{1,4}$ ]] || return 1
    n=$((n + 1))
  done
  if [[ $ip == *::* ]]; then [ "$n" -le 7 ]; else [ "$n" -eq 8 ] && [[ $ip != :* ]] && [[ $ip != *: ]]; fi
}
if [ -n "$cluster_ip" ] && ! is_ip "$cluster_ip"; then
  die "--cluster-ip '$cluster_ip' is not an IP address"
fi
command -v openssl >/dev/null || die "openssl is not installed"
if [ "$files_only" = 0 ]; then
  command -v "$kubectl" >/dev/null || die "$kubectl not found (--kubectl PATH, or --files-only)"
fi

# ssl ARGS...: openssl, quiet unless it fails.
ssl() {
  local msg
  msg=$(openssl "$@" 2>&1) || die "openssl $1 failed: $msg"
}

mkdir -p "$out"
chmod 700 "$out"
umask 077
# The Service's DNS names: what the API server and kube-scheduler check (never the CN), and
# all the CA may sign for.
names="$svc $svc.$ns $svc.$ns.svc $svc.$ns.svc.cluster.local"
if [ -f "$out/ca.key" ] && [ -f "$out/ca.crt" ]; then
  say "reusing the CA in $out"
else
  permitted=
  for name in $names; do permitted="$permitted${permitted:+,}permitted;DNS:$name"; done
  ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=ipkeep-scheduler-ext-ca" -keyout "$out/ca.key" -out "$out/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "nameConstraints=critical,$permitted"
  say "made a CA in $out (ca.key: keep it safe)"
fi

san=
for name in $names; do san="$san${san:+,}DNS:$name"; done
[ -n "$cluster_ip" ] && san="$san,IP:$cluster_ip"
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE\n' "$san" >"$out/tls.ext"
ssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$svc.$ns.svc" \
  -keyout "$out/tls.key.new" -out "$out/tls.csr"
ssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days "$days" -extfile "$out/tls.ext" -out "$out/tls.crt.new"
mv -f "$out/tls.key.new" "$out/tls.key"
mv -f "$out/tls.crt.new" "$out/tls.crt"
rm -f "$out/tls.csr"
say "signed $out/tls.crt for $san, valid $days days"

if [ "$files_only" = 1 ]; then
  say "--files-only: nothing changed in the cluster"
  exit 0
fi

"$kubectl" get namespace "$ns" >/dev/null 2>&1 ||
  die "namespace $ns not found: apply deploy/ first (kubectl apply -k deploy/)"
"$kubectl" -n "$ns" create secret generic "$secret" --type=kubernetes.io/tls \
  --from-file=tls.crt="$out/tls.crt" --from-file=tls.key="$out/tls.key" \
  --from-file=ca.crt="$out/ca.crt" --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
say "Secret $ns/$secret holds the certificate"

bundle=$(base64 -w0 <"$out/ca.crt")
# Both webhook configurations (the pinning one and the lifecycle hooks' one), every webhook.
for kind in mutatingwebhookconfiguration validatingwebhookconfiguration; do
  count=$("$kubectl" get "$kind" "$webhook" -o jsonpath='{range .webhooks[*]}x{end}' 2>/dev/null) ||
    die "$kind $webhook not found: apply deploy/ first"
  patch=
  for ((i = 0; i < ${#count}; i++)); do
    patch="$patch${patch:+,}{\"op\":\"add\",\"path\":\"/webhooks/$i/clientConfig/caBundle\",\"value\":\"$bundle\"}"
  done
  "$kubectl" patch "$kind" "$webhook" --type=json -p "[$patch]" >/dev/null
  say "$kind $webhook trusts the CA"
done
say "kube-scheduler: copy $out/ca.crt to the extender's tlsConfig.caFile on every control-plane node (docs/install.md, step 4)"
