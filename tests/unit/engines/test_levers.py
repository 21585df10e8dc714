"""Cost levers' settings and refusals (no torch): flow_runtime, flow_steps, flow_cfg."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config import EngineSettings, Settings
from app.engines.cosyvoice.config import CosyVoiceConfig
from app.engines.cosyvoice.flow_runtime import (
    FlowOptions,
    FlowRuntimeRefused,
    options_of,
    resolve_flow_runtime,
)
from app.engines.cosyvoice.levers import (
    AppliedLevers,
    LeverRefused,
    Levers,
    apply_levers,
)


def test_defaults_are_todays_behaviour_except_the_exact_cpu_runtime():
    eng = EngineSettings()
    assert eng.flow_runtime == "auto"  # exact to float rounding: ONNX Runtime on a CPU
    assert eng.flow_steps is None and eng.flow_cfg is True  # the model's: they change the audio
    assert eng.onnx_cache_dir.endswith("onnx") and "~" not in eng.onnx_cache_dir


@pytest.mark.parametrize("bad", [{"flow_runtime": "tensorrt"}, {"flow_steps": 0},
                                 {"flow_steps": 101}])
def test_bad_values_are_configuration_errors(bad):
    with pytest.raises(ValidationError):
        EngineSettings(**bad)


def test_env_overrides_reach_the_adapter(monkeypatch):
    monkeypatch.setenv("COSYSERVE_ENGINE__FLOW_RUNTIME", "onnxruntime")
    monkeypatch.setenv("COSYSERVE_ENGINE__FLOW_STEPS", "6")
    monkeypatch.setenv("COSYSERVE_ENGINE__FLOW_CFG", "false")
    monkeypatch.setenv("COSYSERVE_ENGINE__ONNX_CACHE_DIR", "~/graphs")
    cfg = CosyVoiceConfig.from_settings(Settings().engine, "dir")
    levers = cfg.levers()
    assert levers == Levers(flow_runtime="onnxruntime", flow_steps=6, flow_cfg=False,
                            onnx_cache_dir=levers.onnx_cache_dir, threads=1)
    assert levers.onnx_cache_dir.endswith("/graphs") and not levers.onnx_cache_dir.startswith("~")


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

    with pytest.raises(LeverRefused, match="engine.flow_runtime=onnxruntime"):
        apply_levers(Levers(flow_runtime="onnxruntime"), llm=Untouchable(), flow=Untouchable(), version=2,
                     device_type="cuda")


def test_solver_changes_only_off_the_models_settings():
    assert not FlowOptions().changes_solver and not FlowOptions(steps=10).changes_solver
    assert FlowOptions(steps=5).changes_solver and FlowOptions(cfg=False).changes_solver
    assert options_of(object()) == FlowOptions()


def test_what_ran_is_described_for_the_load_log():
    assert AppliedLevers().describe() == "flow estimator on torch"
    got = AppliedLevers(flow=FlowOptions(runtime="onnxruntime", steps=5, cfg=False, onnx_source="cache")).describe()
    assert got == "flow estimator on onnxruntime (cache), 5 flow steps, flow CFG off"
