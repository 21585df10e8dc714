"""Cost levers' settings and refusals (no torch): llm_quantization, flow_runtime, flow_steps, flow_cfg."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.engines.cosyvoice.flow.solver import (
    FlowOptions,
    FlowRuntimeRefused,
    options_of,
    resolve_flow_runtime,
)
from app.engines.cosyvoice.levers import (
    AppliedLevers,
    LeverRefused,
    apply_levers,
)
from app.engines.cosyvoice.quantize import QuantizationRefused, check_llm_quantization
from app.settings import EngineSettings, Settings
from app.settings.runtime import engine_config
from tests.support import configs


def test_defaults_are_todays_behaviour_except_the_exact_cpu_runtime(monkeypatch):
    monkeypatch.delenv("COSYSERVE_ENGINE__ONNX_CACHE_DIR", raising=False)  # the integration tests set it
    eng = EngineSettings()
    assert eng.llm_quantization == "none"  # approximate: the user's choice
    assert eng.flow_runtime == "auto"  # exact to float rounding: ONNX Runtime on a CPU
    assert eng.flow_steps is None and eng.flow_cfg is True  # the model's: they change the audio
    assert eng.onnx_cache_dir.endswith("cosyserve/onnx") and "~" not in eng.onnx_cache_dir


@pytest.mark.parametrize("bad", [{"llm_quantization": "int4"}, {"flow_runtime": "tensorrt"}, {"flow_steps": 0},
                                 {"flow_steps": 101}])
def test_bad_values_are_configuration_errors(bad):
    with pytest.raises(ValidationError):
        EngineSettings(**bad)


def test_env_overrides_reach_the_adapter(monkeypatch):
    monkeypatch.setenv("COSYSERVE_ENGINE__LLM_QUANTIZATION", "int8")
    monkeypatch.setenv("COSYSERVE_ENGINE__FLOW_RUNTIME", "onnxruntime")
    monkeypatch.setenv("COSYSERVE_ENGINE__FLOW_STEPS", "6")
    monkeypatch.setenv("COSYSERVE_ENGINE__FLOW_CFG", "false")
    monkeypatch.setenv("COSYSERVE_ENGINE__ONNX_CACHE_DIR", "~/graphs")
    levers = engine_config(Settings(), "dir").levers
    assert levers == configs.levers(llm_quantization="int8", flow_runtime="onnxruntime", flow_steps=6, flow_cfg=False,
                            onnx_cache_dir=levers.onnx_cache_dir, threads=1)
    assert levers.onnx_cache_dir.endswith("/graphs") and not levers.onnx_cache_dir.startswith("~")


@pytest.mark.parametrize(("device", "version", "dtype", "message"), [
    ("cuda", 2, "fp32", "on CUDA use engine.dtype fp16 or bf16"),
    ("cpu", 1, "fp32", "needs a CosyVoice2/3 model"),
    ("cpu", 2, "bf16", "choose one of the two"),
])
def test_int8_is_refused_where_it_cannot_apply(device, version, dtype, message):
    with pytest.raises(QuantizationRefused, match=message):
        check_llm_quantization("int8", device_type=device, version=version, llm_dtype=dtype)
    check_llm_quantization("none", device_type=device, version=version, llm_dtype=dtype)  # none is always fine


def test_int8_applies_on_a_cpu_v2_v3_fp32_llm():
    for version in (2, 3):
        check_llm_quantization("int8", device_type="cpu", version=version)


@pytest.mark.parametrize(("value", "device", "flow_dtype", "want"), [
    ("auto", "cpu", "fp32", "onnxruntime"), ("auto", "cuda", "fp32", "torch"), ("auto", "cpu", "bf16", "torch"),
    ("torch", "cpu", "fp32", "torch"), ("onnxruntime", "cpu", "fp32", "onnxruntime"),
])
def test_flow_runtime_resolves_per_device(value, device, flow_dtype, want):
    assert resolve_flow_runtime(value, device_type=device, flow_dtype=flow_dtype) == want


@pytest.mark.parametrize(("device", "flow_dtype", "message"), [("cuda", "fp32", "on CUDA use torch"),
                                                               ("cpu", "bf16", "choose one of the two")])
def test_onnxruntime_is_refused_where_it_cannot_apply(device, flow_dtype, message):
    with pytest.raises(FlowRuntimeRefused, match=message):
        resolve_flow_runtime("onnxruntime", device_type=device, flow_dtype=flow_dtype)


def test_refusals_reach_the_loader_as_one_kind_before_any_work():
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError("nothing may be touched before the settings are checked")

    with pytest.raises(LeverRefused, match="engine.llm_quantization=int8 is for CPUs"):
        apply_levers(configs.levers(llm_quantization="int8"), llm=Untouchable(), flow=Untouchable(), version=2,
                     device_type="cuda")
    with pytest.raises(LeverRefused, match="engine.flow_runtime=onnxruntime"):
        apply_levers(configs.levers(flow_runtime="onnxruntime"), llm=Untouchable(), flow=Untouchable(), version=2,
                     device_type="cuda")


def test_solver_changes_only_off_the_models_settings():
    assert not FlowOptions().changes_solver and not FlowOptions(steps=10).changes_solver
    assert FlowOptions(steps=5).changes_solver and FlowOptions(cfg=False).changes_solver
    assert options_of(object()) == FlowOptions()


def test_what_ran_is_described_for_the_load_log():
    assert AppliedLevers().describe() == "LLM as loaded, flow estimator on torch"
    got = AppliedLevers(llm_int8_layers=169, flow=FlowOptions(runtime="onnxruntime", steps=5, cfg=False,
                                                              onnx_source="cache")).describe()
    assert got == "LLM int8 (169 linear layers), flow estimator on onnxruntime (cache), 5 flow steps, flow CFG off"
