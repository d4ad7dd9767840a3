#!/bin/sh
# Run HERE (Debian 12): download the Debian packages the GPU machine lacks (it runs Ubuntu 24.04
# with CUDA, OpenSSL and cuBLAS but no PCRE2, cJSON, libedit, libmicrohttpd) into .deps/, which
# .gitignore keeps out of git and the device tool carries (carry: [".deps"]).
set -eu
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
apt-get download libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
    libcjson-dev libcjson1 libedit-dev libedit2 libbsd0 libmd0 libmicrohttpd-dev libmicrohttpd12
