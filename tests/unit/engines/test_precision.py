"""engine.dtype: what each setting means on this host (no torch needed), and the fp16 alias."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from app.engines.cosyvoice.precision import (
    DEFAULT_STAGES,
    Precision,
    cpu_flags,
    cpu_has_native_bf16,
    resolve_precision,
)
from app.settings import EngineSettings


def test_auto_and_fp32_run_fp32_everywhere():
    for device in ("cpu", "cuda"):
        for dtype in ("auto", "fp32"):
            p = resolve_precision(dtype, device, native_bf16=True)
            assert p == Precision("fp32") and not p.reduced


def test_bf16_on_a_cpu_with_native_bf16_is_quiet(caplog):
    with caplog.at_level(logging.WARNING, logger="cosyserve.engine"):
        p = resolve_precision("bf16", "cpu", native_bf16=True)
    assert p.dtype == "bf16" and p.stages == DEFAULT_STAGES == ("llm", "flow") and p.reduced
    assert not caplog.records


def test_bf16_on_a_cpu_without_it_warns_that_it_is_slow(caplog):
    with caplog.at_level(logging.WARNING, logger="cosyserve.engine"):
        p = resolve_precision("bf16", "cpu", ["flow", "hift"], native_bf16=False)
    assert p.dtype == "bf16" and p.stages == ("flow", "hift")
    assert any("no native bf16" in r.getMessage() and "SLOWER" in r.getMessage() for r in caplog.records)


def test_fp16_on_cuda_halves_the_llm_autocasts_the_flow_and_keeps_hift_fp32(caplog):
    with caplog.at_level(logging.INFO, logger="cosyserve.engine"):
        on_hopper = resolve_precision("fp16", "cuda", native_bf16=True)
    assert on_hopper == Precision("fp16", stages=("llm", "flow"), llm_dtype="bf16")
    assert on_hopper.stage_dtypes() == {"llm": "bf16", "flow": "fp16 autocast", "hift": "fp32"}
    assert any("LLM runs in bf16" in r.getMessage() for r in caplog.records)  # the log says which half
    older = resolve_precision("fp16", "cuda", native_bf16=False)
    assert older.stage_dtypes() == {"llm": "fp16", "flow": "fp16 autocast", "hift": "fp32"}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cosyserve.engine"):
        with_hift = resolve_precision("fp16", "cuda", ["llm", "flow", "hift"], native_bf16=True)
    assert with_hift.stages == ("llm", "flow") and with_hift.stage_dtypes()["hift"] == "fp32"
    assert any("HiFT stays fp32" in r.getMessage() for r in caplog.records)
    assert resolve_precision("fp16", "cuda", ["flow"], native_bf16=True).stage_dtypes() == {
        "llm": "fp32", "flow": "fp16 autocast", "hift": "fp32"}


def test_fp16_on_a_cpu_falls_back_to_fp32(caplog):
    with caplog.at_level(logging.WARNING, logger="cosyserve.engine"):
        assert resolve_precision("fp16", "cpu") == Precision("fp32")
    assert any("needs a CUDA device" in r.getMessage() for r in caplog.records)


def test_no_stages_means_fp32_and_bad_values_are_clear_errors():
    assert resolve_precision("bf16", "cpu", [], native_bf16=True) == Precision("fp32")
    with pytest.raises(ValueError, match="unknown stage"):
        resolve_precision("bf16", "cpu", ["vocoder"])
    with pytest.raises(ValueError, match="must be one of"):
        resolve_precision("int8", "cpu")


def test_bf16_detection_reads_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    assert "avx512_bf16" in cpu_flags(info)
    assert cpu_has_native_bf16(cpu_flags(info))
    assert cpu_has_native_bf16(frozenset({"amx_bf16"}))
    assert not cpu_has_native_bf16(frozenset({"avx2", "fma"}))
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_engine_fp16_was_removed_and_says_what_to_write_instead():
    assert EngineSettings().dtype == "auto" and EngineSettings().dtype_stages == ["llm", "flow"]
    with pytest.raises(ValidationError, match="write engine.dtype: fp16 instead"):
        EngineSettings(fp16=True)
    with pytest.raises(ValidationError):
        EngineSettings(dtype="int8")
    with pytest.raises(ValidationError):
        EngineSettings(dtype_stages=["vocoder"])
