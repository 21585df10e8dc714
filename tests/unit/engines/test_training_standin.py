"""The training-only stand-in for ``cosyvoice.dataset.processor`` (app/engines/cosyvoice/shims.py), no torch.

Fake packages on a temporary ``sys.path`` play the three cases: a processor whose top-level
imports are missing (gets the stand-in), one that imports (kept as it is), and one that does
not exist (nothing registered: a yaml naming it still fails).
"""

from __future__ import annotations

import functools
import inspect
import pydoc
import sys
import textwrap
from pathlib import Path

import pytest
from hyperpyyaml import load_hyperpyyaml

from app.engines.cosyvoice.shims import (
    TRAINING_ONLY_MODULES,
    TrainingOnlyError,
    TrainingOnlyModule,
    stand_in_training_modules,
)

PACKAGES = ("cvbroken", "cvworks", "cvnodata")


@pytest.fixture
def packages(tmp_path: Path, monkeypatch):
    """``cvbroken``: processor imports a missing package; ``cvworks``: it imports; ``cvnodata``: no dataset."""

    def write(path: str, text: str = "") -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))

    for pkg in PACKAGES:
        write(f"{pkg}/__init__.py")
    write("cvbroken/dataset/__init__.py")
    write("cvbroken/dataset/processor.py", "import cosyserve_no_such_training_dep\n\ndef tokenize(data):\n    return data\n")
    write("cvworks/dataset/__init__.py")
    write("cvworks/dataset/processor.py", "def tokenize(data, get_tokenizer=None):\n    return 'real'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES:
            del sys.modules[name]


def test_the_stand_in_is_for_cosyvoice_processor():
    assert TRAINING_ONLY_MODULES == ("cosyvoice.dataset.processor",)


def test_a_processor_that_does_not_import_gets_a_stand_in(packages):
    assert stand_in_training_modules(["cvbroken.dataset.processor"]) == ["cvbroken.dataset.processor"]
    module = sys.modules["cvbroken.dataset.processor"]
    assert isinstance(module, TrainingOnlyModule)
    # any name resolves, as HyperPyYAML looks it up, to a plain function (so !name: takes arguments)
    for name in ("tokenize", "parquet_opener", "compute_whisper_fbank", "a_name_no_version_has"):
        fn = pydoc.locate(f"cvbroken.dataset.processor.{name}")
        assert inspect.isroutine(fn) and fn.__name__ == name, name
        with pytest.raises(TrainingOnlyError) as err:
            fn(iter([]), mode="train")
        message = str(err.value)
        assert f"cvbroken.dataset.processor.{name} is part of CosyVoice's training data pipeline" in message
        assert "inference never runs" in message and "cosyserve_no_such_training_dep" in message
    assert pydoc.locate("cvbroken.dataset.processor.tokenize") is module.tokenize  # one function per name
    assert stand_in_training_modules(["cvbroken.dataset.processor"]) == []  # idempotent


def test_private_and_dunder_names_do_not_resolve(packages):
    stand_in_training_modules(["cvbroken.dataset.processor"])
    module = sys.modules["cvbroken.dataset.processor"]
    for name in ("__path__", "__file__", "__wrapped__", "_reason_", "_private"):
        assert not hasattr(module, name), name


def test_a_yaml_data_pipeline_loads_over_the_stand_in(packages):
    stand_in_training_modules(["cvbroken.dataset.processor"])
    configs = load_hyperpyyaml(textwrap.dedent("""\
        sample_rate: 24000
        tokenize: !name:cvbroken.dataset.processor.tokenize
            allowed_special: 'all'
        resample: !name:cvbroken.dataset.processor.resample
            resample_rate: !ref <sample_rate>
        shuffle: !name:cvbroken.dataset.processor.shuffle
        data_pipeline: [!ref <tokenize>, !ref <resample>, !ref <shuffle>]
        """))
    tokenize, resample, shuffle = configs["data_pipeline"]
    assert isinstance(tokenize, functools.partial) and tokenize.keywords == {"allowed_special": "all"}
    assert resample.keywords == {"resample_rate": 24000}
    assert inspect.isroutine(shuffle)
    for step in configs["data_pipeline"]:
        with pytest.raises(TrainingOnlyError):
            step([])


def test_a_processor_that_imports_is_kept(packages):
    assert stand_in_training_modules(["cvworks.dataset.processor"]) == []
    module = sys.modules["cvworks.dataset.processor"]
    assert not isinstance(module, TrainingOnlyModule)
    assert pydoc.locate("cvworks.dataset.processor.tokenize")([]) == "real"
    assert pydoc.locate("cvworks.dataset.processor.not_there") is None  # the real module does not make names up


def test_a_module_that_does_not_exist_gets_nothing(packages):
    assert stand_in_training_modules(["cvnodata.dataset.processor", "cosyserve_no_such_pkg.processor"]) == []
    assert "cvnodata.dataset.processor" not in sys.modules
    with pytest.raises(ImportError, match="no such entity"):
        load_hyperpyyaml("tokenize: !name:cvnodata.dataset.processor.tokenize\n")
