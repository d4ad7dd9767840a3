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
# Chromium runs the chat page's browser test (tests/cli_serve_browser.sh skips without it): installed
# as root with the rest; without root its absence is only reported, it does not stop the build.
TEST_PKGS="chromium"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=""
for p in $PKGS; do
    installed "$p" || missing="$missing $p"
done
missing_test=""
for p in $TEST_PKGS; do
    installed "$p" || missing_test="$missing_test $p"
done
[ -z "$missing$missing_test" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    if [ -z "$missing" ]; then
        echo "muser: the browser test skips without$missing_test; run as root:  apt-get install -y$missing_test" >&2
        exit 0
    fi
    echo "muser: missing Debian packages:$missing$missing_test" >&2
    echo "run as root:  apt-get update && apt-get install -y$missing$missing_test" >&2
    exit 1
fi
missing="$missing$missing_test"
echo "muser: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
if [ ! -f /var/lib/apt/periodic/muser-updated ]; then
    apt-get update -q && mkdir -p /var/lib/apt/periodic && touch /var/lib/apt/periodic/muser-updated
fi
apt-get install -y -q $missing
