# shellcheck shell=bash
# Sourced by tests/cluster/cluster.sh: the cluster's certificates and kubeconfigs, as kubeadm lays
# them out (one CA; client certificates whose subject is the user and whose organisation is the
# group; the API server's serving certificate for every name clients use).

PKI_DIR="$CLUSTER_DIR/pki"

# _pki_sign NAME SUBJECT [SAN]: a key and a certificate signed by the cluster CA.
_pki_sign() {
    local name=$1 subject=$2 san=${3:-} ext
    openssl genrsa -out "$PKI_DIR/$name.key" 2048 2>/dev/null
    openssl req -new -key "$PKI_DIR/$name.key" -subj "$subject" -out "$PKI_DIR/$name.csr"
    ext="$PKI_DIR/$name.ext"
    if [[ -n $san ]]; then
        printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$ext"
    else
        printf 'extendedKeyUsage=clientAuth\n' >"$ext"
    fi
    openssl x509 -req -in "$PKI_DIR/$name.csr" -CA "$PKI_DIR/ca.crt" -CAkey "$PKI_DIR/ca.key" \
        -CAcreateserial -days 30 -extfile "$ext" -out "$PKI_DIR/$name.crt" 2>/dev/null
    rm -f "$PKI_DIR/$name.csr" "$ext"
}

# _pki_kubeconfig NAME: a kubeconfig presenting NAME's client certificate to the API server.
_pki_kubeconfig() {
    cat >"$CLUSTER_DIR/$1.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: splitproxy-lab
  cluster:
    server: $API_SERVER
    certificate-authority: $PKI_DIR/ca.crt
users:
- name: $1
  user:
    client-certificate: $PKI_DIR/$1.crt
    client-key: $PKI_DIR/$1.key
contexts:
- name: splitproxy-lab
  context: {cluster: splitproxy-lab, user: $1}
current-context: splitproxy-lab
KUBECONFIG
}

# pki_generate: every certificate and kubeconfig the cluster needs, unless they exist.
pki_generate() {
    local node
    [[ -f $CLUSTER_DIR/admin.kubeconfig ]] && return 0
    mkdir -p "$PKI_DIR"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=splitproxy-lab-ca \
        -keyout "$PKI_DIR/ca.key" -out "$PKI_DIR/ca.crt" 2>/dev/null
    _pki_sign apiserver /CN=kube-apiserver "IP:${NODE_IP[$API_NODE]},IP:$KUBERNETES_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN"
    _pki_sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    _pki_sign admin "/O=system:masters/CN=kubernetes-admin"
    _pki_sign controller-manager /CN=system:kube-controller-manager
    _pki_sign scheduler /CN=system:kube-scheduler
    for node in "${NODES[@]}"; do
        _pki_sign "node-$node" "/O=system:nodes/CN=system:node:$node"
        _pki_kubeconfig "node-$node"
    done
    openssl genrsa -out "$PKI_DIR/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI_DIR/sa.key" -pubout -out "$PKI_DIR/sa.pub" 2>/dev/null
    _pki_kubeconfig controller-manager
    _pki_kubeconfig scheduler
    _pki_kubeconfig admin
}
