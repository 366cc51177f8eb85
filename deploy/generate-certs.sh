#!/usr/bin/env bash
# Makes the controller's TLS material and stores it in the cluster: a CA, a serving certificate
# for the control-plane nodes' addresses (the agents dial them, see agent-config), the Secret
# splitproxy-controller-tls (the controller's certificate and key) and the ConfigMap
# splitproxy-controller-ca (the CA agents trust). The CA key stays in the output directory.
#
#   deploy/generate-certs.sh OUT_DIR IP [IP...]
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OUT_DIR IP [IP...]" >&2; exit 64; }
out=$1
shift
mkdir -p "$out"
sans=$(printf 'IP:%s,' "$@")
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=splitproxy-controller-ca \
  -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=splitproxy-controller \
  -keyout "$out/tls.key" -out "$out/tls.csr" 2>/dev/null
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days 365 -extfile <(echo "subjectAltName=${sans%,}") -out "$out/tls.crt" 2>/dev/null
kubectl create namespace splitproxy-system --dry-run=client -o yaml | kubectl apply -f -
kubectl -n splitproxy-system create secret tls splitproxy-controller-tls \
  --cert="$out/tls.crt" --key="$out/tls.key" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n splitproxy-system create configmap splitproxy-controller-ca \
  --from-file=ca.crt="$out/ca.crt" --dry-run=client -o yaml | kubectl apply -f -
echo "certificate for ${sans%,} valid 365 days; CA in $out"
