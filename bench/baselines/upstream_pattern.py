"""System (d): upstream CosyVoice's runtime pattern, on the same engine code.

Upstream's ``runtime/python/fastapi/server.py`` loads one model at start-up and
serves it from ``async def`` endpoints that return a ``StreamingResponse`` over a
plain (sync) generator of int16 PCM bytes; Starlette pulls that generator in its
threadpool, so every request runs on the one shared model in whichever pool
thread is free. Nothing limits how many run at once, nothing rejects, nothing
cancels a request whose client left. This is that pattern (written here, not
copied), with our CosyVoiceEngine as the shared model so that only the serving
design differs from cosyserve.

    python -m bench.baselines.upstream_pattern --model-dir DIR --port 8102
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Form
from starlette.responses import StreamingResponse

from bench.baselines.common import engine_config, parse_args, serve


def build_app(engine: Any) -> FastAPI:
    from app.engines.base import SynthesisRequest

    app = FastAPI(title="upstream-pattern baseline")

    def pcm(req: SynthesisRequest) -> Iterator[bytes]:
        for chunk in engine.synthesize(req, threading.Event()):  # nobody ever sets this flag
            yield chunk.to_bytes()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.api_route("/inference_sft", methods=["GET", "POST"])
    async def inference_sft(tts_text: str = Form(), spk_id: str = Form()) -> StreamingResponse:
        # The generator is lazy: building it here is cheap; the work happens in the threadpool.
        return StreamingResponse(pcm(SynthesisRequest(text=tts_text, mode="sft", speaker=spk_id)))

    return app


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__ or "", argv)
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    engine = CosyVoiceEngine(engine_config(args))
    engine.load()  # upstream builds its model at import time, before uvicorn starts
    engine.warmup()
    serve(build_app(engine), args.port)


if __name__ == "__main__":
    main()
