#!/bin/sh
# Regenerates the test certificates (valid for 100 years): two CAs, a server certificate
# for "srv.server.nyala" and a client certificate from the first, a client certificate from
# the second. EC P-256, as nyala's own PKI (python/nyala/security/pki.py) issues.
set -e
cd "$(dirname "$0")"
days=36500
ca() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days $days \
        -keyout "$1.key" -out "$1.pem" -subj "/CN=$1" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
leaf() { # name, ca, subjectAltName
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nsubjectAltName=%s\n' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
        -days $days -out "$1.pem" -extfile "$1.ext" 2>/dev/null
    openssl pkcs8 -topk8 -nocrypt -in "$1.key" -out "$1.key.tmp" && mv "$1.key.tmp" "$1.key"
    rm -f "$1.csr" "$1.ext" "$2.srl"
}
ca ca
ca other-ca
leaf server ca "DNS:srv.server.nyala,URI:nyala://server/srv"
leaf client ca "DNS:cli.server.nyala,URI:nyala://server/cli"
leaf stranger other-ca "DNS:cli.server.nyala,URI:nyala://server/cli"
rm -f ca.key other-ca.key
