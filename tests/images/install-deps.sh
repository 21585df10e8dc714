#!/usr/bin/env bash
# What `make test-images` needs from Debian, installed only when missing (CI runs as root):
#   podman (+ runc: crun refuses hybrid cgroup hosts; netavark + aardvark-dns: its network, and
#   iptables, which netavark runs to set up every build step's and container's network but which
#   no package pulls in (podman only suggests it); uidmap, slirp4netns, fuse-overlayfs as podman
#   recommends), unless a docker daemon answers;
#   mmdebstrap, which builds the base-image stand-in where no registry is reachable.
# Without root it says what to install and fails. tests/images/run.py then runs deploy/images/preflight,
# which checks that the engine really builds and runs with what is here (one line if not).
set -euo pipefail

missing=()
if ! { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }; then
    for pkg in podman runc netavark aardvark-dns iptables uidmap slirp4netns fuse-overlayfs; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
fi
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "missing system packages: ${missing[*]}; install them as root: apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "installing ${missing[*]} (Debian)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
