#!/usr/bin/env bash
# System packages the test suite needs, from Debian, installed only when missing:
#   nginx     the load balancer in front of three replicas (tests/cluster, `make test-cluster`)
#   chromium  the headless browser for the playground test, driven by the playwright package
#             (tests/integration/api/test_playground_browser.py; never `playwright install`)
# (kubectl, hadolint and kubernetes-validate come as wheels with the dev extra.)
# Needs root for apt-get (CI runs as root); without root it says what to install and fails.
set -euo pipefail

missing=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "missing system packages: ${missing[*]}; install them as root: apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "installing ${missing[*]} (Debian)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
