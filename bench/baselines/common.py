"""Shared bits of the two baseline servers: argument parsing, the engine config, uvicorn."""

from __future__ import annotations

import argparse
from typing import Any

from fastapi import FastAPI

HOST = "127.0.0.1"  # baselines listen on loopback only


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--torch-threads", type=int, default=1)
    return ap.parse_args(argv)


def engine_config(args: argparse.Namespace) -> Any:
    from app.settings.runtime import engine_config_of

    return engine_config_of(args.model_dir, torch_threads=args.torch_threads)


def serve(app: FastAPI, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)
