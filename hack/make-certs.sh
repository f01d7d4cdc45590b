#!/usr/bin/env bash
# Make the certificates for mutual TLS between kube-scheduler and the flexlease extender, for
# clusters without cert-manager (with it: manifests/overlays/cert-manager). Uses openssl only.
#
#   hack/make-certs.sh DIR [NAMESPACE]
#
# writes a private CA (DIR/ca.crt, DIR/ca.key: keep the key offline) and two Secret payloads:
#   DIR/extender/{tls.crt,tls.key,ca.crt}   serving certificate of flexlease-extender.NAMESPACE.svc
#   DIR/scheduler/{tls.crt,tls.key,ca.crt}  kube-scheduler's client certificate, CN flexlease-scheduler
# each with ca.crt = the CA (the extender checks client certificates against it; kube-scheduler
# checks the extender's serving certificate against it). Then:
#   kubectl -n NAMESPACE create secret generic flexlease-extender-tls --from-file=DIR/extender
#   kubectl -n NAMESPACE create secret generic flexlease-scheduler-tls --from-file=DIR/scheduler
set -euo pipefail
dir=${1:?usage: hack/make-certs.sh DIR [NAMESPACE]}
ns=${2:-flexlease-system}
days=${DAYS:-365}
umask 077
mkdir -p "$dir/extender" "$dir/scheduler"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -s "$dir/ca.key" ]; then
  key "$dir/ca.key"
  openssl req -x509 -new -key "$dir/ca.key" -out "$dir/ca.crt" -days 3650 -subj "/CN=flexlease-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
fi

# issue NAME CN EXTENSIONS: DIR/NAME/{tls.key,tls.crt,ca.crt} signed by the CA.
issue() {
  local out="$dir/$1" cn=$2 ext=$3
  key "$out/tls.key"
  openssl req -new -key "$out/tls.key" -subj "/CN=$cn" -out "$out/tls.csr"
  openssl x509 -req -in "$out/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -out "$out/tls.crt" -extfile <(printf '%b' "$ext") 2>/dev/null
  rm -f "$out/tls.csr"
  cp "$dir/ca.crt" "$out/ca.crt"
}

svc="flexlease-extender.$ns.svc"
issue extender "$svc" \
  "subjectAltName=DNS:$svc,DNS:$svc.cluster.local\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n"
issue scheduler flexlease-scheduler \
  "subjectAltName=DNS:flexlease-scheduler\nextendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n"
echo "wrote $dir/extender and $dir/scheduler (CA $dir/ca.crt); next:"
echo "  kubectl -n $ns create secret generic flexlease-extender-tls --from-file=$dir/extender"
echo "  kubectl -n $ns create secret generic flexlease-scheduler-tls --from-file=$dir/scheduler"
