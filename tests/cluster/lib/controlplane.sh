# shellcheck shell=bash
# Sourced by tests/cluster/cluster.sh: the control plane, as processes in the control-plane
# nodes' network namespaces (where kubeadm would run them as host-network static Pods): etcd and
# kube-apiserver on cp-1, kube-controller-manager and kube-scheduler on cp-2.

controlplane_up() {
    local pki=$PKI_DIR
    process_running etcd || start_process etcd "$API_NODE" "$ETCD_BIN/etcd" \
        --data-dir "$CLUSTER_DIR/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster default=http://127.0.0.1:2380 --log-level warn
    process_running kube-apiserver || start_process kube-apiserver "$API_NODE" \
        "$KUBE_BIN/kube-apiserver" \
        --etcd-servers=http://127.0.0.1:2379 \
        --advertise-address="${NODE_IP[$API_NODE]}" --bind-address=0.0.0.0 --secure-port=6443 \
        --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
        --client-ca-file="$pki/ca.crt" \
        --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types=InternalIP \
        --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
        --service-account-issuer="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
        --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
        --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true --v=1
    wait_for "the API server" 180 kc get --raw /readyz
    process_running kube-controller-manager || start_process kube-controller-manager \
        "$SCHEDULER_NODE" "$KUBE_BIN/kube-controller-manager" \
        --kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
        --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
        --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
        --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
        --service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$POD_CIDR" \
        --allocate-node-cidrs=false --v=1
    process_running kube-scheduler || start_process kube-scheduler "$SCHEDULER_NODE" \
        "$KUBE_BIN/kube-scheduler" --kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
        --authentication-kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
        --authorization-kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
        --bind-address=127.0.0.1 --leader-elect=false --v=1
}

controlplane_down() {
    local name
    for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
        stop_process "$name"
    done
}
