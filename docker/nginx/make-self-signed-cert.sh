#!/usr/bin/env bash
# A self-signed certificate for trying the stack: docker/nginx/certs/tls.{crt,key}.
# Production: put the real certificate chain and key at the same paths (never commit them).
#   docker/nginx/make-self-signed-cert.sh [HOSTNAME]    (default: localhost)
set -euo pipefail
host="${1:-localhost}"
dir="$(cd "$(dirname "$0")" && pwd)/certs"
mkdir -p "$dir"
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
  -subj "/CN=${host}" -addext "subjectAltName=DNS:${host},DNS:localhost,IP:127.0.0.1" \
  -keyout "$dir/tls.key" -out "$dir/tls.crt"
chmod 644 "$dir/tls.crt"
echo "wrote $dir/tls.crt and $dir/tls.key (self-signed for ${host}, 30 days)"
