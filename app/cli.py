"""The ``cosyserve`` command: serve, config, make-tiny-model, check-config."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_serve(args: argparse.Namespace) -> int:
    from app import heap

    allocator = heap.configure()  # before any thread and torch: the caps apply to every thread (app/heap.py)
    from app.settings import ConfigError, load_settings

    server: dict = {}
    if args.host:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    overrides: dict = {"server": server} if server else {}
    if args.workers is not None:
        overrides["pool"] = {"workers": args.workers}
    try:
        settings = load_settings(args.config, **overrides)
    except ConfigError as exc:
        print(f"cosyserve: {exc}", file=sys.stderr)
        return 2
    _setup_logging(settings.server.log_level)
    if not settings.dev.fake_engine and settings.engine.model_dir:
        from app.engines.cosyvoice.layout import unreadable

        denied = unreadable(Path(settings.engine.model_dir).expanduser())
        if denied:  # before the server starts, in one line: not a FileNotFoundError from deep in a loader
            print(f"cosyserve: {denied}", file=sys.stderr)
            return 2
    if not settings.dev.fake_engine and settings.engine.device != "auto":
        from app.engines.cosyvoice.device import DeviceUnavailable, resolve_device

        try:  # before the server starts: a GPU that is not there is an operator's error, said in one line
            resolve_device(settings.engine.device)
        except DeviceUnavailable as exc:
            print(f"cosyserve: {exc}", file=sys.stderr)
            return 2
    from app.server import run

    # after the checks above, whose refusals are one line each
    logging.getLogger("cosyserve.heap").info("native memory: %s; heap trimmed every %g s (server.heap_trim_interval_s)",
                                             allocator, settings.server.heap_trim_interval_s)
    run(settings)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print the effective settings and where each value came from (default, the file, the environment)."""
    from app.settings import ConfigError
    from app.settings.explain import explain, render

    try:
        rows = explain(args.config)
    except ConfigError as exc:
        print(f"cosyserve: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({r.key: {"value": r.value, "source": r.source} for r in rows}, indent=2))
    else:
        print(render(rows))
    return 0


def cmd_make_tiny_model(args: argparse.Namespace) -> int:
    _setup_logging("info")
    from app.devmodels.tiny import build_tiny_model, tiny_version_available
    from app.settings import ConfigError, load_settings

    cosyvoice_path = args.cosyvoice_path
    if not cosyvoice_path:  # engine.cosyvoice_path from --config / $COSYSERVE_CONFIG / COSYSERVE_ENGINE__COSYVOICE_PATH
        try:
            cosyvoice_path = load_settings(args.config).engine.cosyvoice_path
        except ConfigError as exc:
            print(f"cosyserve: {exc}", file=sys.stderr)
            return 2
    ok, why = tiny_version_available(args.version, cosyvoice_path)
    if not ok:
        print(f"cosyserve: cannot build a tiny CosyVoice{args.version} model: {why}", file=sys.stderr)
        return 2
    try:
        path = build_tiny_model(args.out, args.version, long=args.long, instruct=args.instruct, seed=args.seed,
                                full_size=args.full_size, cosyvoice_path=cosyvoice_path)
    except (FileExistsError, ValueError, RuntimeError) as exc:
        print(f"cosyserve: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    """Import every name the given configs refer to, as loading them would (the images run it at build)."""
    from app.settings import ConfigError, load_settings

    try:
        cosyvoice_path = args.cosyvoice_path or load_settings(args.config).engine.cosyvoice_path
    except ConfigError as exc:
        print(f"cosyserve: {exc}", file=sys.stderr)
        return 2
    from app.engines.base import EngineFailure
    from app.engines.cosyvoice.layout import CONFIG_FILES, detect_version
    from app.engines.cosyvoice.model_config import (
        named_objects,
        served_objects,
        unresolved_names,
    )
    from app.engines.cosyvoice.shims import TrainingOnlyModule, prepare_imports

    sources: list[tuple[str, str]] = []
    try:
        if args.version:
            from app.devmodels.configs import render_yaml

            sources += [(f"cosyserve's CosyVoice{v} config", render_yaml(v)) for v in args.version]
        for given in args.files:
            path = Path(given)
            if path.is_dir():
                path = path / CONFIG_FILES[detect_version(path)]
            sources.append((str(path), path.read_text(encoding="utf-8")))
        if not sources:
            raise ValueError("nothing to check: give --version N or model configs / model dirs")
        prepare_imports(cosyvoice_path)
    except (EngineFailure, OSError, ImportError, ValueError) as exc:
        print(f"cosyserve: {exc}", file=sys.stderr)
        return 2
    import cosyvoice

    processor = sys.modules.get("cosyvoice.dataset.processor")
    kind = "training-only stand-in" if isinstance(processor, TrainingOnlyModule) else "the real module"
    print(f"CosyVoice code from {Path(cosyvoice.__file__).parent.parent}; cosyvoice.dataset.processor: {kind}")
    failed = 0
    for label, text in sources:
        # What serving imports must import; a name only a training-only entry uses (layout.TRAINING_ONLY_ENTRIES,
        # replaced by null before the loader builds anything) is reported, never a failure: the images carry
        # no training dependencies (matcha's HiFi-GAN discriminator imports matplotlib).
        served = served_objects(text)
        training = [name for name in named_objects(text) if name not in served]
        missing = unresolved_names(text, served)
        print(f"{'FAILED' if missing else 'ok'}: {label}: {len(served) - len(missing)} of {len(served)} names "
              f"import" + (f" ({len(training)} more only in training-only entries, not built when serving)"
                          if training else ""))
        for name, why in missing.items():
            print(f"  {name}: {why}")
        for name, why in unresolved_names(text, training).items():
            print(f"  training only, not needed: {name}: {why}")
        failed += bool(missing)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosyserve", description="A production inference server for CosyVoice TTS.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the HTTP server")
    p.add_argument("--config", help="config.yaml (default: $COSYSERVE_CONFIG, else built-in defaults)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", type=int, help="engine slots (pool.workers)")
    p.set_defaults(func=cmd_serve)
    g = sub.add_parser("config", help="print the effective settings and where each value came from")
    g.add_argument("--config", help="config.yaml (default: $COSYSERVE_CONFIG, else built-in defaults)")
    g.add_argument("--json", action="store_true", help="as one JSON object: key -> {value, source}")
    g.set_defaults(func=cmd_config)
    t = sub.add_parser("make-tiny-model", help="write a tiny random-weight CosyVoice model dir (for tests)")
    t.add_argument("--version", type=int, choices=(1, 2, 3), default=2)
    t.add_argument("--long", action="store_true", help="generate many speech tokens (streaming yields several chunks)")
    t.add_argument("--instruct", action="store_true", help="v1 only: mark the dir as an -Instruct model")
    t.add_argument("--full-size", action="store_true",
                   help="v2 only: CosyVoice2-0.5B's real dimensions (~4.5 GB, for benchmarks)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--cosyvoice-path", help="CosyVoice checkout to build with (default: engine.cosyvoice_path); "
                   "version 3 needs one with the CosyVoice3 classes, e.g. upstream")
    t.add_argument("--config", help="config.yaml to read engine.cosyvoice_path from (default: $COSYSERVE_CONFIG)")
    t.add_argument("out", help="output dir (must not exist or be empty)")
    t.set_defaults(func=cmd_make_tiny_model)
    c = sub.add_parser("check-config", help="import every name model configs refer to, as loading them would")
    c.add_argument("files", nargs="*", help="model configs (cosyvoice*.yaml) or model dirs")
    c.add_argument("--version", type=int, choices=(1, 2, 3), action="append",
                   help="also check cosyserve's own CosyVoice<N> config (it carries a released config's data "
                   "pipeline); repeatable")
    c.add_argument("--cosyvoice-path", help="CosyVoice checkout to import from (default: engine.cosyvoice_path)")
    c.add_argument("--config", help="config.yaml to read engine.cosyvoice_path from (default: $COSYSERVE_CONFIG)")
    c.set_defaults(func=cmd_check_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
