"""``cosyserve check-config``: import every name a model config refers to (the images run it at build)."""

from __future__ import annotations

import importlib.util
import shlex
import shutil

import pytest

from app.cli import main
from app.engines.cosyvoice import layout

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _installed_cosyvoice(monkeypatch):
    monkeypatch.delenv("COSYSERVE_ENGINE__COSYVOICE_PATH", raising=False)
    monkeypatch.delenv("COSYSERVE_CONFIG", raising=False)


def test_our_v1_and_v2_configs_import_with_the_default_install(capsys):
    assert main(["check-config", "--version", "1", "--version", "2"]) == 0
    out = capsys.readouterr().out
    assert "ok: cosyserve's CosyVoice1 config: 29 of 29 names import (4 more only in training-only" in out
    assert "ok: cosyserve's CosyVoice2 config:" in out
    if importlib.util.find_spec("pyarrow") is None:
        assert "cosyvoice.dataset.processor: training-only stand-in" in out


def test_v3_needs_the_v3_classes_and_says_which_are_missing(capsys):
    assert main(["check-config", "--version", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: cosyserve's CosyVoice3 config" in out and "cosyvoice.llm.llm.CosyVoice3LM: no such name" in out


def test_a_model_dir_and_a_config_naming_a_missing_module(tiny_models, tmp_path, capsys):
    bad = tmp_path / "m"
    shutil.copytree(tiny_models(2), bad)
    config = bad / layout.CONFIG_FILES[2]
    config.write_text(config.read_text() + "extra: !name:cosyvoice.dataset.no_such_module.step\n")
    assert main(["check-config", str(tiny_models(2))]) == 0
    assert main(["check-config", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"ok: {tiny_models(2) / layout.CONFIG_FILES[2]}" in out
    assert f"FAILED: {config}" in out and "cosyvoice.dataset.no_such_module.step: no such name" in out


def test_nothing_to_check_is_a_usage_error(tmp_path, capsys):
    assert main(["check-config"]) == 2
    assert main(["check-config", str(tmp_path)]) == 2  # no config in it
    err = capsys.readouterr().err
    assert "nothing to check" in err and "is not a CosyVoice model dir" in err


def test_the_cpu_images_build_step_passes_here(capsys):
    """The very command the CPU Dockerfile runs at build (tests/unit/deploy/test_images.py checks it is there)."""
    from tests.support.dockerfiles import CHECK_CONFIG, runs

    command = CHECK_CONFIG["Dockerfile"]
    assert command in runs("Dockerfile")
    assert main(shlex.split(command)[1:]) == 0
    assert "FAILED" not in capsys.readouterr().out


def _image_distributions() -> set[str]:
    """What the images install (tests/unit/deploy/test_images.py: the same steps as `make setup`), the dev extra left out.

    torch, requirements/nodeps.txt (--no-deps), requirements/engine.txt, then cosyserve's own dependencies,
    each with what its metadata requires (markers evaluated here, extras followed).
    """
    import re
    import tomllib
    from importlib import metadata
    from pathlib import Path

    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parents[2]

    def lines(name: str) -> list[str]:
        return [line.split("#")[0].strip() for line in (root / "requirements" / name).read_text().splitlines()
                if line.split("#")[0].strip()]

    def canon(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    found = {canon(Requirement(r).name) for r in lines("nodeps.txt")}
    todo = [Requirement(r) for r in ["torch", *lines("engine.txt"),
                                     *tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]]]
    while todo:
        req = todo.pop()
        if canon(req.name) in found:
            continue
        found.add(canon(req.name))
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for r in map(Requirement, requires):
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in (req.extras or {""})):
                todo.append(r)
    return found


def test_the_images_check_passes_without_the_dev_extra(tmp_path):
    """The images' venv has no dev extra (no matplotlib, which matcha's HiFi-GAN discriminator imports): the check
    still passes, because that GAN wrapper is training-only and the loader never builds it. Run with every module
    only the dev extra brings unimportable, as in the image (before the fix: 31 of 33 names, exit 1)."""
    import os
    import subprocess
    import sys
    from importlib import metadata
    from pathlib import Path

    from tests.support.dockerfiles import CHECK_CONFIG

    image = _image_distributions()
    blocked = sorted(top for top, dists in metadata.packages_distributions().items()
                     if not any(d.lower().replace("_", "-").replace(".", "-") in image for d in dists)
                     and top not in ("app", "tests"))
    assert "matplotlib" in blocked and "pytest" in blocked and "torch" not in blocked and "fastapi" not in blocked
    (tmp_path / "run.py").write_text(f"""
import sys
from importlib.machinery import PathFinder

BLOCKED = {set(blocked)!r}

class NoDevExtra(PathFinder):  # a venv without the dev extra: its modules are not found at all
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in BLOCKED else super().find_spec(name, path, target)

sys.meta_path[:] = [NoDevExtra if f is PathFinder else f for f in sys.meta_path]
from app.cli import main
raise SystemExit(main({shlex.split(CHECK_CONFIG["Dockerfile"])[1:]!r}))
""")
    root = str(Path(__file__).resolve().parents[2])  # this tree's app, not whichever one is installed
    r = subprocess.run([sys.executable, str(tmp_path / "run.py")], capture_output=True, text=True, timeout=300,
                       cwd=root, env={**os.environ, "PYTHONPATH": root}, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: cosyserve's CosyVoice1 config: 29 of 29 names import (4 more only in training-only entries" in r.stdout
    assert "training only, not needed: cosyvoice.hifigan.hifigan.HiFiGan" in r.stdout
    assert "No module named 'matplotlib'" in r.stdout
