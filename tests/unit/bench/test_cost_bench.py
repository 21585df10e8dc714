"""bench/cost.py's levers plan: variants, goal lines and the table (no model runs)."""

from __future__ import annotations

from bench.cost import LEVER_PLAN, LEVER_VARIANTS, VARIANTS
from bench.report import cost_markdown as markdown
from bench.report import lever_goals


def case(cpu: float, audio_per_wall: float, ttfa: float = 1.0, conc: int = 1) -> dict:
    return {"concurrency": conc, "cpu_s_per_request": cpu, "wall_s": cpu, "rtf": cpu, "audio_s_per_wall_s": audio_per_wall,
            "ttfa_s": ttfa, "audio_s_per_request": 1.5, "flow_frames_per_request": 176,
            "stages_s_per_request": {"llm": 1.0, "flow": 2.0, "hift": 0.1}}


def result(cpu1: float, wall8: float) -> dict:
    return {"cases": {"short-whole": case(cpu1, 1 / cpu1), "short-stream": case(cpu1, 1 / cpu1, ttfa=cpu1 / 3),
                      "short-c8": case(cpu1, wall8, conc=8)}, "load_s": 1.0}


def test_every_lever_variant_has_settings_and_cases_for_both_models():
    for v in LEVER_VARIANTS:
        assert v in VARIANTS and ("full", v) in LEVER_PLAN and ("tiny", v) in LEVER_PLAN
    assert VARIANTS["fp32"] == {}  # today's default: torch flow, fp32 LLM (the adapter's defaults)
    assert VARIANTS["all"] == {"llm_quantization": "int8", "flow_runtime": "onnxruntime", "flow_steps": 5,
                               "flow_cfg": False}


def test_goal_lines_say_met_or_missed():
    full = {"fp32": result(30.0, 0.1), "ort": result(24.0, 0.12), "int8-ort": result(20.0, 0.17),
            "all": result(10.0, 0.3)}
    tiny = {"fp32": result(0.50, 3.0), "int8": result(0.60, 3.0)}
    goals = lever_goals({"full": full, "tiny": tiny})
    text = "\n".join(goals)
    assert "GOAL full, int8 + ONNX Runtime: CPU s/req at c=1 1.50x lower (goal >= 1.4x): met" in text
    assert "GOAL full, exact-only levers (ONNX Runtime): CPU s/req at c=1 1.25x lower (goal >= 1.2x): met" in text
    assert "GOAL full, int8-ort: audio s per wall s at c=8 1.70x fp32's (goal >= 1.6x): met" in text
    assert "GOAL tiny: no regression" in text and "MISSED: int8 short-whole 0.600 vs 0.500" in text
    table = markdown({"commands": ["python -m bench cost --plan levers"], "host": {"cores": 2},
                      "results": {"full": full}, "goals": goals}, "levers")
    assert "| full | int8-ort | short-c8 | 8 | 20.00 |" in table and "## Goals" in table
