"""deploy/images/preflight: a host that cannot build says so in one line, in seconds, before any build.

Run against a stand-in `podman` on a PATH that holds only what the script needs, so the answer does
not depend on what this host has installed: Debian 12's podman 4.3 runs its build steps' network with
netavark, which needs iptables, which nothing pulls in (issue 46: CI failed there minutes into the
CPU image's build with `netavark: No such file or directory`). `make test-images` runs the real
preflight against the real engine first (tests/images/run.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.paths import ROOT

TOOLS = ("bash", "dirname", "mkdir", "grep", "tail", "mktemp", "rm", "cp", "tar", "ldd", "cat")


def fake_host(tmp_path: Path, *, uid: int = 0, iptables: bool, build_error: str = "") -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        os.symlink(shutil.which(tool), bin_dir / tool)
    (bin_dir / "id").write_text(f"#!/bin/bash\necho {uid}\n")
    # `info` answers (netavark with --format), `build` fails with build_error when given, the rest succeed
    (bin_dir / "podman").write_text(
        "#!/bin/bash\n"
        'case "$1" in\n'
        '  info) [ "$2" = --format ] && echo netavark; exit 0 ;;\n'
        f'  build) [ -s {tmp_path}/build-error ] && {{ cat {tmp_path}/build-error >&2; exit 125; }}; echo abc; exit 0 ;;\n'
        "  *) exit 0 ;;\n"
        "esac\n")
    (tmp_path / "build-error").write_text(build_error)
    if iptables:
        (bin_dir / "iptables").write_text("#!/bin/bash\nexit 0\n")
    for script in bin_dir.iterdir():
        if not script.is_symlink():
            script.chmod(0o755)
    return {"PATH": str(bin_dir), "ENGINE": "podman", "CONTAINERS_CONF": str(tmp_path / "containers.conf")}


def preflight(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "deploy/images/preflight")], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_netavark_without_iptables_is_named_in_one_line(tmp_path):
    r = preflight(fake_host(tmp_path, iptables=False))
    assert r.returncode == 1
    expected = ("preflight: podman's network backend netavark needs iptables, which is not installed "
                "(apt-get install iptables)")
    assert r.stderr.splitlines() == [expected], r.stderr


def test_a_build_step_that_fails_is_said_in_one_line(tmp_path):
    error = 'Error: building at STEP "RUN /usr/bin/true": netavark: No such file or directory (os error 2)'
    r = preflight(fake_host(tmp_path, iptables=True, build_error=error))
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"preflight: podman cannot run a one-line build step: {error}"], r.stderr


def test_a_host_that_builds_passes_quietly(tmp_path):
    r = preflight(fake_host(tmp_path, iptables=True))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_rootless_podman_needs_no_iptables(tmp_path):
    """Rootless podman's default network is slirp4netns: netavark's iptables is not asked for."""
    r = preflight(fake_host(tmp_path, uid=1000, iptables=False))
    assert (r.returncode, r.stderr) == (0, "")


def test_the_image_tests_install_what_the_preflight_asks_for():
    deps = (ROOT / "tests/images/install-deps.sh").read_text()
    assert "iptables" in deps.split("for pkg in", 1)[1].split(";", 1)[0]
    assert "deploy/images/preflight" in (ROOT / "tests/images/run.py").read_text()
