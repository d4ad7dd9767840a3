#!/bin/sh
# Install the Debian packages muser builds and tests with. Idempotent: installs only what is
# missing. Without root it prints the exact apt-get line and fails.
set -eu
PKGS="build-essential cmake pkg-config clang libclang-rt-dev libssl-dev libpcre2-dev curl \
libcjson-dev libmicrohttpd-dev libedit-dev openssl iproute2"
# openssl (the CLI) makes the remote-prefill tests' certificates (scripts/make-test-certs.sh);
# iproute2 (ip netns) lets tests/cli_handoff.sh put producer and consumer in two namespaces.
# node + npm run the tiktoken comparison test (tests/cli_tiktoken.sh skips without them). A node
# installed some other way (e.g. nodesource's nodejs, which conflicts with Debian's npm) is kept.
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "muser: missing Debian packages:$missing" >&2
    echo "run as root:  apt-get update && apt-get install -y$missing" >&2
    exit 1
fi
echo "muser: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
if [ ! -f /var/lib/apt/periodic/muser-updated ]; then
    apt-get update -q && mkdir -p /var/lib/apt/periodic && touch /var/lib/apt/periodic/muser-updated
fi
apt-get install -y -q $missing
