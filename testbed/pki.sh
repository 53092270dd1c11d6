#!/usr/bin/env bash
# Issues the test bed's certificates (one CA, as kubeadm lays them out) and kubeconfigs.
# A fresh set every `testbed-up`: nothing outlives the cluster it was made for.
# shellcheck source=testbed/lib.sh
source "$(dirname "$0")/lib.sh"

PKI=$TB/pki
mkdir -p "$PKI"
cd "$PKI"

new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

# issue NAME SUBJECT EXT_USAGE [SAN]: a CA-signed certificate valid for a year.
issue() {
  local name=$1 subject=$2 usage=$3 san=${4:-}
  new_key "$name"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n $san ]] && echo "subjectAltName=$san"
  } >"$name.ext"
  openssl req -new -key "$name.key" -subj "$subject" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

new_key ca
openssl req -x509 -new -key ca.key -subj "/CN=statefleet-testbed-ca" -days 3650 \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
  -out ca.crt 2>/dev/null

issue etcd-server "/CN=etcd" serverAuth,clientAuth "IP:127.0.0.1,DNS:localhost"
issue apiserver-etcd-client "/CN=kube-apiserver-etcd-client" clientAuth
issue apiserver "/CN=kube-apiserver" serverAuth \
  "IP:127.0.0.1,IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN"
issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
issue kubelet "/CN=$NODE_NAME" serverAuth "IP:$NODE_IP,DNS:$NODE_NAME"
issue kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
issue admin "/O=system:masters/CN=statefleet-testbed-admin" clientAuth
issue controller-manager "/CN=system:kube-controller-manager" clientAuth
issue scheduler "/CN=system:kube-scheduler" clientAuth
issue kube-proxy "/CN=system:kube-proxy" clientAuth
issue kube-router "/CN=statefleet-testbed:kube-router" clientAuth # the NetworkPolicy enforcer's reads
issue s3-server "/CN=statefleet-testbed-s3" serverAuth "IP:$NODE_IP,IP:127.0.0.1,DNS:localhost"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
chmod 600 ./*.key

# kubeconfig FILE CERT_NAME: talks to the API server on the node bridge.
kubeconfig() {
  local file=$1 cert=$2
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: statefleet-testbed
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority-data: $(base64 -w0 ca.crt)
users:
- name: $cert
  user:
    client-certificate-data: $(base64 -w0 "$cert.crt")
    client-key-data: $(base64 -w0 "$cert.key")
contexts:
- name: statefleet-testbed
  context: {cluster: statefleet-testbed, user: $cert}
current-context: statefleet-testbed
EOF
  chmod 600 "$file"
}

kubeconfig "$TB/kubeconfig" admin
for component in controller-manager scheduler kube-proxy kube-router kubelet-client; do
  kubeconfig "$PKI/$component.kubeconfig" "$component"
done
