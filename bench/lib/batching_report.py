"""The batching benchmark's numbers: per-point summaries, goal ratios, the markdown tables and the plot.

Results layout (``batching.json``)::

    {"models": {"full" | "tiny": {"systems": {"per_request" | "batched": {
        "label", "peak_rss", "load_s", "points": [{"mode": "nonstream" | "stream", "concurrency", ...}]}}}}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.lib.batching_plan import SPEECH_TOKENS_PER_S
from bench.lib.load import Result, percentile

SYSTEMS = ("per_request", "batched")


def summarize_point(results: list[Result], wall_s: float, sample_rate: int) -> dict[str, Any]:
    """Client-side numbers of one point: audio seconds per wall second, latency and TTFA percentiles."""
    ok = [r for r in results if r.kind == "ok"]
    audio_s = sum(r.nbytes for r in ok) / (2.0 * sample_rate)  # 16-bit mono PCM
    lat = [r.latency_s for r in ok]
    ttfa = [r.ttfa_s for r in ok if r.ttfa_s is not None]
    per_s = audio_s / wall_s if wall_s > 0 else 0.0
    return {
        "requests": len(results), "ok": len(ok), "rejected": sum(r.kind == "rejected" for r in results),
        "timeouts": sum(r.kind == "timeout" for r in results), "errors": sum(r.kind == "error" for r in results),
        "wall_s": wall_s, "audio_s": audio_s, "audio_s_per_s": per_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "audio_s_per_request": audio_s / len(ok) if ok else None,
        # non-streaming CosyVoice2: one speech token per 40 ms of audio (cross-check for the metric)
        "speech_tokens_per_s_from_audio": per_s * SPEECH_TOKENS_PER_S,
        "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
        "ttfa_p50_s": percentile(ttfa, 50), "ttfa_p99_s": percentile(ttfa, 99),
    }


def point(results: dict, model: str, system: str, mode: str, c: int) -> dict | None:
    sys_ = results.get("models", {}).get(model, {}).get("systems", {}).get(system)
    if not sys_:
        return None
    for p in sys_.get("points", []):
        if p.get("mode") == mode and p.get("concurrency") == c:
            return p
    return None


def _get(p: dict | None, key: str) -> float | None:
    if p is None:
        return None
    v = p.get(key)
    return float(v) if isinstance(v, int | float) else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def tokens_per_s(p: dict | None) -> tuple[float | None, str]:
    """The server's speech-token rate (``tts_llm_tokens_total``), else the one implied by the audio."""
    v = _get(p, "llm_tokens_per_s")
    if v is not None:
        return v, "metric"
    return _get(p, "speech_tokens_per_s_from_audio"), "from audio"


def _goal(name: str, value: float | None, op: str, target: float, detail: str = "") -> dict[str, Any]:
    ok = None if value is None else (value >= target if op == ">=" else value <= target)
    return {"goal": name, "value": value, "op": op, "target": target, "ok": ok, "detail": detail}


def evaluate_goals(results: dict) -> list[dict[str, Any]]:
    goals: list[dict[str, Any]] = []
    for c in (8, 16):
        pr, pb = point(results, "full", "per_request", "nonstream", c), point(results, "full", "batched", "nonstream", c)
        (tb, sb), (tr, sr) = tokens_per_s(pb), tokens_per_s(pr)
        goals.append(_goal(f"full c={c}: LLM speech tokens/s, batched / per-request", ratio(tb, tr), ">=", 4.0,
                           f"{_fmt(tb)} ({sb}) / {_fmt(tr)} ({sr})"))
    for mode in ("nonstream", "stream"):
        pr, pb = point(results, "full", "per_request", mode, 8), point(results, "full", "batched", mode, 8)
        a, b = _get(pb, "audio_s_per_s"), _get(pr, "audio_s_per_s")
        goals.append(_goal(f"full c=8 {mode}: audio-s/s, batched / per-request", ratio(a, b), ">=", 1.3,
                           f"{_fmt(a)} / {_fmt(b)}"))
    t8, t1 = (_get(point(results, "full", "batched", "stream", c), "ttfa_p50_s") for c in (8, 1))
    goals.append(_goal("full batched: TTFA p50 at c=8 / at c=1", ratio(t8, t1), "<=", 2.0, f"{_fmt(t8)} s / {_fmt(t1)} s"))
    lb, lr = (_get(point(results, "full", s, "nonstream", 1), "latency_p50_s") for s in ("batched", "per_request"))
    goals.append(_goal("full c=1: latency p50, batched / per-request", ratio(lb, lr), "<=", 1.10,
                       f"{_fmt(lb)} s / {_fmt(lr)} s"))
    systems = results.get("models", {}).get("full", {}).get("systems", {})
    rb, rr = (systems.get(s, {}).get("peak_rss") for s in SYSTEMS[::-1])
    goals.append(_goal("full: peak RSS, batched / per-request (2 workers)", ratio(rb, rr), "<=", 1.0,
                       f"{_mib(rb)} / {_mib(rr)}"))
    tiny = results.get("models", {}).get("tiny", {}).get("systems", {}).get("batched", {}).get("points", [])
    for c in sorted({p["concurrency"] for p in tiny if p.get("mode") == "nonstream"}):
        a = _get(point(results, "tiny", "batched", "nonstream", c), "audio_s_per_s")
        b = _get(point(results, "tiny", "per_request", "nonstream", c), "audio_s_per_s")
        goals.append(_goal(f"tiny c={c}: audio-s/s, batched / per-request", ratio(a, b), ">=", 0.95,
                           f"{_fmt(a)} / {_fmt(b)}"))
    return goals


def _fmt(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _mib(v: float | None) -> str:
    return "-" if not v else f"{v / 2**20:.0f} MiB"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def goal_lines(goals: list[dict[str, Any]]) -> list[str]:
    out = []
    for g in goals:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[g["ok"]]
        out.append(f"{mark}  {g['goal']}: {_fmt(g['value'])} (goal {g['op']} {g['target']:g}) [{g['detail']}]")
    return out


def markdown(results: dict, goals: list[dict[str, Any]]) -> str:
    lines = ["# Continuous LLM batching: per-request pool vs batched", "",
             (f"Run {results.get('started', '?')}, {results.get('cores', '?')} cores, load average at start "
             f"{_fmt((results.get('loadavg_start') or [None])[0])}, {_fmt(results.get('elapsed_s', 0) / 60, 1)} min. "
             "Generated by `python -m bench serve --scenario batching` (see fullsize-model.md and README.md here)."), "",
             (f"Sentence: \"{results.get('text', '')}\" (sft, preset speaker, PCM {results.get('sample_rate')} Hz). "
             "Closed loop: c clients, a fixed number of requests per point; throughput = audio seconds of the "
             "successful requests / wall seconds from the first send to the last byte. p99 over few requests "
             "is close to the maximum."), ""]
    for model, m in results.get("models", {}).items():
        systems = m.get("systems", {})
        lines += [f"## {model} model", ""]
        for key in SYSTEMS:
            s = systems.get(key, {})
            if s:
                lines.append(f"* **{key}**: {s.get('label', '')}; load {_fmt(s.get('load_s'), 1)} s, "
                             f"RSS ready {_mib(s.get('rss_at_ready'))}, peak {_mib(s.get('peak_rss'))}"
                             + (f"; FAILED: {s['failed'][:300]}" if s.get("failed") else ""))
        lines += ["", "### Non-streaming", "",
                  ("| c | req PR / B | audio-s/s PR | audio-s/s B | B/PR | p50 ms PR | p50 ms B | p99 ms PR | p99 ms B "
                  "| tok/s PR | tok/s B | tok/s B/PR | mean batch B | step ms B | peak RSS PR | peak RSS B |"),
                  "|" + "---|" * 16]
        for c in _levels(m, "nonstream"):
            pr, pb = (point(results, model, s, "nonstream", c) for s in SYSTEMS)
            (tr, _), (tb, _) = tokens_per_s(pr), tokens_per_s(pb)
            lines.append("| " + " | ".join([
                str(c), f"{_n(pr)} / {_n(pb)}", _fmt(_get(pr, "audio_s_per_s")), _fmt(_get(pb, "audio_s_per_s")),
                _fmt(ratio(_get(pb, "audio_s_per_s"), _get(pr, "audio_s_per_s"))),
                _ms(_get(pr, "latency_p50_s")), _ms(_get(pb, "latency_p50_s")),
                _ms(_get(pr, "latency_p99_s")), _ms(_get(pb, "latency_p99_s")),
                _fmt(tr, 1), _fmt(tb, 1), _fmt(ratio(tb, tr)), _fmt(_get(pb, "llm_batch_mean"), 1),
                _ms(_get(pb, "llm_step_mean_s")), _mib(_get(pr, "peak_rss")), _mib(_get(pb, "peak_rss"))]) + " |")
        lines += ["", "### Streaming (time to first audio)", "",
                  ("| c | req PR / B | TTFA p50 ms PR | TTFA p50 ms B | TTFA p99 ms PR | TTFA p99 ms B "
                  "| audio-s/s PR | audio-s/s B | B/PR |"), "|" + "---|" * 9]
        for c in _levels(m, "stream"):
            pr, pb = (point(results, model, s, "stream", c) for s in SYSTEMS)
            lines.append("| " + " | ".join([
                str(c), f"{_n(pr)} / {_n(pb)}", _ms(_get(pr, "ttfa_p50_s")), _ms(_get(pb, "ttfa_p50_s")),
                _ms(_get(pr, "ttfa_p99_s")), _ms(_get(pb, "ttfa_p99_s")), _fmt(_get(pr, "audio_s_per_s")),
                _fmt(_get(pb, "audio_s_per_s")),
                _fmt(ratio(_get(pb, "audio_s_per_s"), _get(pr, "audio_s_per_s")))]) + " |")
        lines.append("")
    lines += ["## Goals", "", "| | goal | value | target | detail |", "|---|---|---|---|---|"]
    for g in goals:
        mark = {True: "pass", False: "**FAIL**", None: "n/a"}[g["ok"]]
        lines.append(f"| {mark} | {g['goal']} | {_fmt(g['value'])} | {g['op']} {g['target']:g} | {g['detail']} |")
    lines += ["", ("tok/s: the server's `tts_llm_tokens_total` over the point when it has the metric, else "
              "the rate implied by the audio length (25 tokens per second of audio); the goal lines say which."), ""]
    return "\n".join(lines)


def _n(p: dict | None) -> str:
    return "-" if p is None else f"{p.get('ok', 0)}/{p.get('requests', 0)}"


def _levels(model: dict, mode: str) -> list[int]:
    return sorted({p["concurrency"] for s in model.get("systems", {}).values() for p in s.get("points", [])
                   if p.get("mode") == mode})


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("nonstream", "audio_s_per_s", "audio s / wall s (non-streaming)"),
              ("nonstream", "latency_p50_s", "latency p50, s (non-streaming)"),
              ("stream", "ttfa_p50_s", "time to first audio p50, s (streaming)"),
              ("nonstream", "tokens", "speech tokens / s (non-streaming)"))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (mode, key, title) in zip(axes.flat, panels, strict=True):
        for model, m in results.get("models", {}).items():
            for system, style in zip(SYSTEMS, ("--", "-"), strict=True):
                pts = sorted((p for p in m.get("systems", {}).get(system, {}).get("points", [])
                              if p.get("mode") == mode), key=lambda p: p["concurrency"])
                ys = [tokens_per_s(p)[0] if key == "tokens" else p.get(key) for p in pts]
                xy = [(p["concurrency"], y) for p, y in zip(pts, ys, strict=True) if y is not None]
                if xy:
                    ax.plot(*zip(*xy, strict=True), style, marker="o", label=f"{model} {system}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
