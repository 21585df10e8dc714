"""``bench.gpu_check``'s report: the JSON document as markdown (docs/benchmarks/gpu.md)."""

from __future__ import annotations

import math
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    values = [v for v in values if v == v]  # drop NaN
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))]


def _ms(v: Any) -> str:
    return "-" if v is None else f"{1000 * v:.0f}"


def _f(v: Any, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _gib(v: Any) -> str:
    return "-" if v is None else f"{v / 2**30:.2f}"


def _phase(doc: dict, name: str) -> dict | None:
    """The phase's result, or None with the reason written by the caller."""
    value = doc.get(name)
    return value if isinstance(value, dict) and "skipped" not in value and "failed" not in value else None


def _why(doc: dict, name: str) -> str:
    value = doc.get(name) or {}
    return value.get("skipped") or value.get("failed") or "not run"


def markdown(doc: dict) -> str:
    env = doc["environment"]
    gpu = env.get("name") != "cpu"
    lines = [f"# GPU check: {env.get('name')} ({doc['mode']})", ""]
    if not gpu:
        lines += ["**CPU run** (`--device cpu`): it proves the check works; none of these numbers is a GPU figure.", ""]
    v = env.get("versions", {})
    device = (f"{env.get('device')}: {env.get('name')}, compute capability {env.get('capability')}, "
              f"{env.get('memory_gib')} GiB" if gpu else "cpu")
    lines += ["| | |", "|---|---|", f"| device | {device} |"]
    if gpu:
        lines.append(f"| CUDA / driver | {env.get('cuda')} / {env.get('driver')} |")
    lines += [f"| torch / transformers / numpy | {v.get('torch')} / {v.get('transformers')} / {v.get('numpy')} |",
              f"| Python | {env.get('python')} on {env.get('platform')} ({env.get('cpu_count')} CPUs, "
              f"{env.get('torch_threads')} torch threads) |",
              f"| PYTORCH_CUDA_ALLOC_CONF | {env.get('alloc_conf') or '(unset)'} |",
              f"| model | {doc['model']['dir']} ({'full-size' if doc['model']['full_size'] else 'tiny'} random-weight "
              f"CosyVoice2; built in {doc['model']['build_s']:.0f} s, loaded in {doc['model']['load_s']:.1f} s) |",
              f"| precision | {', '.join(f'{k} {x}' for k, x in doc['model']['precision'].items())} |",
              f"| run | {doc['started']}, {doc['elapsed_s']} s of a {doc['budget_s']:.0f} s budget |", ""]
    lines += ["## Parity", ""]
    p = _phase(doc, "parity")
    if p:
        lines.append(f"- Batched tokens equal CosyVoice's own `llm.inference` (greedy, fp32): **{p['tokens_equal']} of "
                     f"{p['requests']}** requests (tokens {p['tokens']}, batch {p['batch']}); largest log-prob "
                     f"difference where a token has any chance: {p['max_logp_diff']:.2e}.")
    else:
        lines.append(f"- Batched vs CosyVoice's own: {_why(doc, 'parity')}.")
    s = _phase(doc, "seeded")
    if s:
        lines.append(f"- Seeded, alone vs inside a batch of 3: {'equal' if s['alone_equals_batched'] else 'DIFFERENT'} "
                     f"({s['tokens']} tokens).")
        if s.get("cpu_equals_device") is None:
            lines.append("- Seeded, CPU vs GPU: not applicable (one device).")
        else:
            lines.append(f"- Seeded, CPU vs this device: {'equal' if s['cpu_equals_device'] else 'DIFFERENT'} "
                         f"({s['cpu_tokens']} tokens on the CPU; first difference at "
                         f"{s['first_difference'] if s['first_difference'] is not None else '-'}).")
    else:
        lines.append(f"- Seeded: {_why(doc, 'seeded')}.")
    d = _phase(doc, "drift")
    if d:
        lines += ["", "| LLM dtype | KV cache | steps | max abs log-prob diff (live) | max rel L2 | top-1 agreement |",
                  "|---|---|---:|---:|---:|---:|"]
        for name, r in d.items():
            lines.append(f"| {name} | {r['kv_dtype']} | {r['steps']} | {r['max_abs_live']:.3g} | "
                         f"{r['max_rel_l2']:.3g} | {r['top1_agree']:.0%} |")
    else:
        lines.append(f"- Half-precision drift: {_why(doc, 'drift')}.")
    lines += ["", "## One request, per stage (non-streamed, device synchronised at each boundary; median)", ""]
    st = _phase(doc, "stages")
    if st:
        lines += ["| frontend ms | LLM ms | flow ms | HiFT ms | speech tokens | audio s |",
                  "|---:|---:|---:|---:|---:|---:|",
                  f"| {_ms(st['frontend'])} | {_ms(st['llm'])} | {_ms(st['flow'])} | {_ms(st['hift'])} | "
                  f"{st['tokens']:.0f} | {_f(st['audio_s'])} |"]
    else:
        lines.append(f"{_why(doc, 'stages')}.")
    lines += ["", "## Streaming (closed loop, sft, one sentence)", "",
              "| concurrency | requests | TTFA p50 ms | TTFA p95 ms | audio s / wall s | LLM step ms p50 | mean batch | errors |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for pt in doc.get("streaming", []):
        if "skipped" in pt:
            lines.append(f"| {pt['concurrency']} | skipped: {pt['skipped']} | | | | | | |")
            continue
        lines.append(f"| {pt['concurrency']} | {pt['requests']} | {_ms(pt['ttfa_p50_s'])} | {_ms(pt['ttfa_p95_s'])} | "
                     f"{_f(pt['audio_s_per_wall_s'])} | {_f(pt['llm_step_ms_p50'], 1)} | {_f(pt['llm_mean_batch'], 1)} | "
                     f"{pt['error_count']} |")
    lines += ["", "## Host syncs per decode step (4 sequences)", ""]
    sy = _phase(doc, "syncs")
    if sy:
        px = sy["proxy"]
        lines.append(f"- CPU proxy (`bench/probes/syncs.py`): max {px.get('max')}, mean {px.get('mean')} over "
                     f"{px.get('steps')} steps ({px.get('kinds')}).")
        if "cuda_flagged" in sy:
            cf = sy["cuda_flagged"]
            lines.append(f"- `torch.cuda.set_sync_debug_mode`: max {cf.get('max')}, mean {cf.get('mean')} flagged per "
                         f"step over {cf.get('steps')} steps ({cf.get('messages') or 'none'}); plus {sy['by_design']}.")
        else:
            lines.append("- `torch.cuda.set_sync_debug_mode`: not run (no CUDA device).")
    else:
        lines.append(f"{_why(doc, 'syncs')}.")
    lines += ["", "## Prefill: 16 requests join a running batch of 4 at once", ""]
    pf = _phase(doc, "prefill")
    if pf:
        lines += ["| prefill | forwards | running batch's token gap ms | usual gap ms | prefill ms | "
                  "all 16 joined at one step |", "|---|---:|---:|---:|---:|---|"]
        for mode in ("one_by_one", "batched"):
            r = pf[mode]
            lines.append(f"| {mode.replace('_', ' ')} | {r['prefill_forwards']} | {_f(r['gap_ms'], 1)} | "
                         f"{_f(r['usual_gap_ms'], 1)} | {_f(r['prefill_ms'], 1)} | {r['all_joined_at_once']} |")
        lines.append(f"\nInputs of {pf['prompt_tokens'][0]}-{pf['prompt_tokens'][1]} tokens ({pf['input_tokens']} in "
                     f"all), median of {pf['rounds']} round(s); gap one by one / batched: {_f(pf['speedup'], 2)}x; the "
                     f"joiners' first tokens {'equal' if pf['first_tokens_equal'] else 'DIFFER'} between the modes.")
    else:
        lines.append(f"{_why(doc, 'prefill')}.")
    lines += ["", "## Batched token2wav: engine.token2wav_batch off vs on", ""]
    tw = _phase(doc, "token2wav")
    if tw:
        from bench.probes.t2w_phases import header, line

        lines.append(header())
        for setting, rows in tw["runs"].items():
            lines += [line(setting, r) for r in rows]
        lines.append("\nStreamed requests, one engine per setting, closed loop; flow rounds only with the setting on.")
    else:
        lines.append(f"{_why(doc, 'token2wav')}.")
    mem = doc.get("gpu_memory")
    lines += ["", "## GPU memory", ""]
    if mem:
        lines.append(f"Peak while streaming: {_gib(mem['peak_allocated_bytes'])} GiB allocated, "
                     f"{_gib(mem['peak_reserved_bytes'])} GiB reserved by the allocator "
                     f"({_gib(mem['allocated_after_bytes'])} GiB allocated after).")
    else:
        lines.append("Not applicable (no CUDA device).")
    lines += ["", "Written by `python -m bench gpu` (docs/gpu.md); the JSON it writes beside this report "
              "(default .cache/bench/gpu_check/, not committed) holds every value. Random weights: speed and "
              "memory are the real model's, audio is noise.", ""]
    return "\n".join(lines)
