#!/bin/sh
# make-test-certs.sh OUT — credentials for a first try and the tests of remote prefill
# (docs/handoff.md): a private CA (OUT/ca.pem, OUT/ca.key), a directory per role in the shape
# `--tls-dir` reads (OUT/producer, OUT/consumer: ca.pem, cert.pem, key.pem; the producer's
# certificate for serverAuth, the consumer's for clientAuth) and a shared HMAC key (OUT/hmac.key,
# mode 600). EC P-256, one year. openssl CLI only. For production, use your own CA and keys.
set -eu
OUT=${1:?usage: make-test-certs.sh OUT}
command -v openssl >/dev/null || { echo "make-test-certs.sh: openssl not found" >&2; exit 1; }
umask 077
mkdir -p "$OUT/producer" "$OUT/consumer"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key "$OUT/ca.key"
openssl req -x509 -new -key "$OUT/ca.key" -out "$OUT/ca.pem" -days 365 -subj "/CN=muser handoff test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
for role in producer consumer; do
  d=$OUT/$role
  key "$d/key.pem"
  openssl req -new -key "$d/key.pem" -out "$d/req.csr" -subj "/CN=muser-$role" 2>/dev/null
  if [ "$role" = producer ]; then
    eku="serverAuth"; san="subjectAltName=DNS:localhost,IP:127.0.0.1"
  else
    eku="clientAuth"; san="subjectAltName=DNS:muser-consumer"
  fi
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n%s\n' \
    "$eku" "$san" >"$d/ext.cnf"
  openssl x509 -req -in "$d/req.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" -set_serial "0x$(openssl rand -hex 8)" \
    -days 365 -extfile "$d/ext.cnf" -out "$d/cert.pem" 2>/dev/null
  cp "$OUT/ca.pem" "$d/ca.pem"
  rm -f "$d/req.csr" "$d/ext.cnf"
done
openssl rand -hex 32 >"$OUT/hmac.key"
chmod 600 "$OUT/hmac.key"
chmod 644 "$OUT/ca.pem" "$OUT/producer/ca.pem" "$OUT/consumer/ca.pem" "$OUT/producer/cert.pem" "$OUT/consumer/cert.pem"
echo "make-test-certs.sh: $OUT/{producer,consumer}/{ca,cert,key}.pem and $OUT/hmac.key"
