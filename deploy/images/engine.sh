# shellcheck shell=bash
# Sourced by deploy/images/*: picks the container engine (ENGINE: docker if its daemon answers,
# else podman) and, for podman, a containers.conf for hosts its defaults fail on, used only by
# these scripts (CONTAINERS_CONF; the host's own configuration is not touched):
#   - default ulimits within what the host allows: podman asks for nofile 1048576, above a VM's
#     hard limit ("setrlimit RLIMIT_NOFILE: Operation not permitted"), and an nproc such a VM
#     refuses too (runc: "error setting rlimit type 6"); 4096 processes is plenty here
#   - runc where cgroups are v1 / hybrid: crun refuses them ("cgroups in hybrid mode not supported")
if [ -z "${ENGINE:-}" ]; then
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then ENGINE=docker
    elif command -v podman >/dev/null 2>&1; then ENGINE=podman
    else echo "no container engine: install podman (apt-get install podman) or docker" >&2; exit 1
    fi
fi
if [ "$ENGINE" = podman ] && [ -z "${CONTAINERS_CONF:-}" ]; then
    mkdir -p .cache/images
    nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ] && nofile=1048576
    {
        echo "# written by deploy/images/engine.sh for this host"
        echo "[containers]"
        echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=4096:4096\"]"
        if [ ! -e /sys/fs/cgroup/cgroup.controllers ] && command -v runc >/dev/null 2>&1; then
            echo "[engine]"
            echo "runtime = \"runc\""
        fi
    } >.cache/images/containers.conf
    export CONTAINERS_CONF=$PWD/.cache/images/containers.conf
fi
export ENGINE
