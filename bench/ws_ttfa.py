"""Time to first audio for text that arrives at an LLM's pace: WebSocket vs POST (each text's tokens at ``--rate``,
the POST when the LLM would have finished), or (``--clients``) the clients of bench/lib/clients_ttfa.py side by side
at each ``--concurrency`` level. bench/README.md describes both (``--livekit`` left the tree after 776f578)."""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
from pathlib import Path

from bench.lib import clients_ttfa as clients
from bench.lib.load import percentile
from bench.lib.procs import SuiteParser, cosyserve, free_port, machine, tiny_config
from bench.report import add_goal, fmt, goals_table, print_goals, ratio, save, table

COMMAND = ".venv/bin/python -m bench serve --scenario ws"
TEXTS = {
    "20 words": "The quick brown fox jumps over the lazy dog while a small grey cat watches from the warm window.",
    "40 words": ("Voice agents stream the words of a language model into speech while the model is still writing "
                 "them, so the listener hears the start of the answer long before its last word has been generated, "
                 "and the conversation feels like talking to a person."),
}


def tokens(text: str) -> list[str]:
    """LLM-sized pieces: each word with its leading space, punctuation on its own."""
    return re.findall(r"\s*\w+|\s*[^\w\s]", text)


def one(leg, base: str, text: str, rate: float, seed: int) -> tuple[float, float]:
    """(TTFA, total) seconds of one session of ``leg`` (clients.ws or clients.post) for ``text`` at ``rate``."""
    s = asyncio.run(leg(clients.Target(base), tokens(text), rate, seed))
    return s.ttfa, s.total


def run_clients(target: clients.Target, names: list[str], levels: list[int], pieces: list[str], rate: float,
                reps: int) -> dict:
    """Each client at each concurrency ``reps`` times (the clients interleaved), after one warm-up each."""
    raw: dict = {n: {c: {"ttfa": [], "audio_s": 0.0, "wall_s": 0.0, "early": 0, "errors": []} for c in levels}
                 for n in names}
    for name in names:
        for x in asyncio.run(clients.batch(name, target, pieces, rate, 1, 0)):
            if not isinstance(x, clients.Session):
                print(f"warm-up {name}: {x!r}", flush=True)
    for c in levels:
        for rep in range(reps):
            for name in names:
                ok, bad = [], []
                for x in asyncio.run(clients.batch(name, target, pieces, rate, c, 1 + rep * c)):
                    (ok if isinstance(x, clients.Session) and x.first is not None else bad).append(x)
                r = raw[name][c]
                r["errors"] += [repr(x)[:200] for x in bad]
                r["ttfa"] += [x.ttfa for x in ok]
                r["early"] += sum(bool(x.early) for x in ok)
                if ok:
                    r["audio_s"] += sum(x.audio_s for x in ok)
                    r["wall_s"] += max(x.end for x in ok) - min(x.t0 for x in ok)
                errors = f" errors {[repr(x)[:200] for x in bad]}" if bad else ""
                print(f"c={c} rep {rep} {name}: TTFA {[round(x.ttfa, 3) for x in ok]}{errors}", flush=True)
    return raw


def clients_summary(raw: dict) -> dict:
    """Per client and concurrency: first-audio p50/p99, audio seconds per wall second, early count."""
    return {n: {c: {"sessions": len(r["ttfa"]), "errors": len(r["errors"]), "early": r["early"],
                    "ttfa_p50_s": percentile(r["ttfa"], 50), "ttfa_p99_s": percentile(r["ttfa"], 99),
                    "audio_per_wall": ratio(r["audio_s"], r["wall_s"])}
                for c, r in levels.items()} for n, levels in raw.items()}


def clients_goals(summ: dict, levels: list[int]) -> list[dict]:
    def p50(name: str, c: int) -> float | None:
        return summ.get(name, {}).get(c, {}).get("ttfa_p50_s")

    goals: list[dict] = []
    for c in levels:
        w = summ.get("wyoming-stream", {}).get(c)
        add_goal(goals, f"c={c}: wyoming-stream first audio before synthesize-stop",
                 f"{w['early']}/{w['sessions'] + w['errors']}" if w else None, "all",
                 w["early"] == w["sessions"] + w["errors"] > 0 if w else None)
        for a, b, limit in [("wyoming-stream", "ws", 1.2), *((p, o, 1.0) for p, o in clients.PLUGIN_VS_OPENAI.items())]:
            v = ratio(p50(a, c), p50(b, c))  # Wyoming: within 1.2x of the WebSocket; a plugin: below its OpenAI path
            ok = None if v is None else v <= limit if limit > 1 else v < limit
            add_goal(goals, f"c={c}: {a} p50 / {b} p50", v, f"<= {limit:g}" if limit > 1 else f"< {limit:g}", ok,
                     detail=f"{fmt(p50(a, c), 3)} s vs {fmt(p50(b, c), 3)} s")
    return goals


def clients_report(args: argparse.Namespace, summ: dict, goals: list[dict], skipped: dict[str, str],
                   n: int, reps: int) -> str:
    levels = ",".join(str(c) for c in args.concurrency)
    lines = [
        f"# First audio per client: text streamed at {args.rate:g} tokens/s, {levels} sessions at once",
        "",
        (f"Command: `{COMMAND} --clients {','.join(args.clients)} --concurrency {levels} --rate {args.rate:g} "
         f"--reps {reps} --text '{args.text}'` (tiny random-weight CosyVoice2, default config: batched LLM, "
         "bistream, the pool and admission as the server sizes them; 1 torch thread; the Wyoming port on)"),
        (f"{machine()} Text: {args.text}, {n} tokens, written in {(n - 1) / args.rate:.2f} s; {reps} rounds of each "
         "level, clients interleaved."),
        "",
        *table(["client", "sessions at once", "sessions", "errors", "first audio p50 (s)", "first audio p99 (s)",
                "audio s / wall s", "first audio before synthesize-stop"],
               [[name, c, p["sessions"], p["errors"], fmt(p["ttfa_p50_s"], 3), fmt(p["ttfa_p99_s"], 3),
                 fmt(p["audio_per_wall"]), f"{p['early']}/{p['sessions']}" if name == "wyoming-stream" else "-"]
                for c in args.concurrency for name, by_c in summ.items() if (p := by_c[c])]),
        "",
        ("First audio: from the first token the LLM wrote (whole-text clients wait for the last one, then send). "
         "audio s / wall s: the audio of all sessions of a level over the time from their first token to their "
         "last audio, summed over the rounds."),
        *([""] + [f"Skipped {name}: {why}" for name, why in skipped.items()] if skipped else []),
        "", "## Goals", "", *goals_table(goals, tail=("detail",)),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = SuiteParser(__doc__, "ws_ttfa", server=False)
    ap.add_argument("--rate", type=float, default=20.0, help="tokens per second the 'LLM' writes")
    ap.add_argument("--reps", type=int, default=None, help="runs per point (default 5; with --clients 3)")
    ap.add_argument("--clients", type=lambda v: [c for c in v.split(",") if c], default=None,
                    help=f"instead, time these clients side by side (ws-clients.md): {','.join(clients.CLIENTS)}")
    ap.add_argument("--concurrency", type=lambda v: [int(c) for c in v.split(",")], default=[1, 4],
                    help="with --clients: sessions at once, each level in turn (default 1,4)")
    ap.add_argument("--text", choices=list(TEXTS), default="40 words", help="with --clients: the text")
    args = ap.parse(argv)
    unknown = [c for c in args.clients or [] if c not in clients.CLIENTS]
    if unknown:
        ap.error(f"unknown clients {unknown}; known: {','.join(clients.CLIENTS)}")
    reps = args.reps or (3 if args.clients else 5)
    skipped = {c: why for c in args.clients or [] if (why := clients.missing(c))}
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = tiny_config(tmp, engine={"torch_threads": 1}, pool={"workers": 2})
        if args.clients:  # the pool as the server sizes it (4 sessions fit), the Wyoming port on
            del cfg["pool"]
            cfg["wyoming"] = {"port": free_port()}
        with cosyserve("ws-ttfa", cfg, Path(tmp)) as srv:
            base = srv.base_url
            if args.clients:
                pieces = tokens(TEXTS[args.text])
                names = [c for c in args.clients if c not in skipped]
                raw = run_clients(clients.Target(base, cfg["wyoming"]["port"]), names, args.concurrency, pieces,
                                  args.rate, reps)
                summ = clients_summary(raw)
                goals = clients_goals(summ, args.concurrency)
                md = clients_report(args, summ, goals, skipped, len(pieces), reps)
                print(md)
                print_goals(goals)
                save(args.out, "ws-clients", {"summary": summ, "raw": raw, "skipped": skipped}, md)
                return
            rows = []
            for label, text in TEXTS.items():
                one(clients.ws, base, text, args.rate, 0)  # warm-up
                one(clients.post, base, text, 1e6, 0)
                runs = [(one(clients.ws, base, text, args.rate, rep), one(clients.post, base, text, args.rate, rep))
                        for rep in range(reps)]  # per run: (ws, post), each (TTFA, done)
                n = len(tokens(text))
                med = [statistics.median(r[leg][i] for r in runs) for i in (0, 1) for leg in (0, 1)]
                rows.append((label, n, (n - 1) / args.rate, *med))
                print(rows[-1], flush=True)
    lines = [
        f"# Time to first audio: text streamed at {args.rate:g} tokens/s over the WebSocket vs. POST after the text",
        "",
        (f"Command: `{COMMAND} --rate {args.rate:g} --reps {reps}` (tiny random-weight CosyVoice2, default "
         "config: batched LLM, bistream; 2 workers, 1 torch thread)"),
        f"{machine()} Medians of {reps} runs.",
        "",
        *table(["text", "tokens", "text written in (s)", "TTFA WebSocket (s)", "TTFA POST after text (s)",
                "done WebSocket (s)", "done POST (s)"],
               [[label, n, f"{written:.2f}", *(f"{t:.3f}" for t in times)] for label, n, written, *times in rows]),
        "", "All times from the first token the LLM wrote. 'done': the last audio byte.",
    ]
    print("\n".join(lines))
    save(args.out, "ws-ttfa", None, "\n".join(lines) + "\n")
