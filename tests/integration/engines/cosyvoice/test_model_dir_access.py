"""A model dir the server may not read fails at start, in one line: "permission denied", the path and the uid.

What a user meets who builds a dir on the host and mounts it into the image (which runs as uid 10001):
before, the loader said `FileNotFoundError: No such file or directory: .../model.safetensors`. Run as
root (CI), the server is started without the capabilities that let root read any file (setpriv), and
the file belongs to another uid; run as anyone else, the file is made unreadable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.engines.cosyvoice import layout
from tests.support.paths import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
OTHER_UID = 10001  # the image's user
AS_ROOT = os.getuid() == 0


@pytest.fixture
def model_copy(tiny_models, tmp_path) -> Path:
    shutil.copytree(tiny_models(2), tmp_path / "tiny2")
    return tmp_path / "tiny2"


def deny(path: Path, mode: int) -> None:
    """Make ``path`` unreadable to the server: another owner and ``mode`` as root, else mode 0."""
    if AS_ROOT:
        os.chown(path, OTHER_UID, 0)
        path.chmod(mode)
    else:
        path.chmod(0)


def serve(model_dir: Path) -> tuple[subprocess.CompletedProcess, float]:
    """``cosyserve serve`` on ``model_dir``; as root, without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH."""
    env = {"COSYSERVE_ENGINE__MODEL_DIR": str(model_dir), "PYTHONUNBUFFERED": "1", "PATH": "/usr/bin:/bin"}
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if AS_ROOT else []
    t0 = time.monotonic()
    out = subprocess.run([*drop, sys.executable, "-m", "app.cli", "serve", "--port", "0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    return out, time.monotonic() - t0


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr)
    return lines[0]


def test_an_unreadable_weights_file_is_named_with_the_uid_at_start(model_copy):
    weights = model_copy / layout.QWEN_DIR / "model.safetensors"
    deny(weights, 0o600)  # the mode transformers' save_pretrained leaves
    out, took = serve(model_copy)
    line = one_line(out)
    assert line.startswith(f"cosyserve: permission denied: {weights} ("), line
    assert f"not readable by uid {os.getuid()} " in line and f"chmod -R a+rX {model_copy}" in line, line
    if AS_ROOT:
        assert f"mode 0600, owner uid {OTHER_UID}" in line, line
    assert took < 30, f"took {took:.1f}s: it should fail before loading anything"


def test_an_unreadable_subdir_is_named_too(model_copy):
    sub = model_copy / layout.QWEN_DIR
    deny(sub, 0o700)
    try:
        line = one_line(serve(model_copy)[0])
    finally:
        sub.chmod(0o755)
    assert line.startswith(f"cosyserve: permission denied: {sub} ("), line


def test_the_loader_says_the_same_where_no_cli_runs(model_copy):
    """The engine's own load (tests, the lifespan) fails with the same words, not a FileNotFoundError."""
    weights = model_copy / layout.QWEN_DIR / "model.safetensors"
    deny(weights, 0o600)
    code = ("import sys; from app.engines.base import EngineFailure; from app.engines.cosyvoice.load import "
            "load_model_dir\ntry:\n    load_model_dir(sys.argv[1])\nexcept EngineFailure as e:\n    print(e)")
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if AS_ROOT else []
    out = subprocess.run([*drop, sys.executable, "-c", code, str(model_copy)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.stdout.startswith(f"permission denied: {weights} ("), out.stdout + out.stderr
