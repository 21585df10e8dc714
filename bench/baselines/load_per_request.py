"""System (c), the "before": a server that loads the model for every request.

The shape of the seed this project replaced: a plain FastAPI handler that builds
an engine, loads the weights, synthesises, and drops the engine again. The
handlers are sync ``def``, so Starlette runs each in its threadpool (up to 40 at
once); there is no admission control and no reuse. The request body is the same
as cosyserve's ``POST /v1/tts`` (raw PCM only), so one load generator drives both.
Python caches the CosyVoice imports after the first request; the benchmark's
warm-up requests pay them, so what is measured is the load itself.

    python -m bench.baselines.load_per_request --model-dir DIR --port 8101
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.responses import Response, StreamingResponse

from bench.baselines.common import engine_config, parse_args, serve


class Body(BaseModel):
    text: str
    speaker: str | None = None
    stream: bool = False
    format: str = "pcm"


def build_app(config: object) -> FastAPI:
    from app.engines.base import SynthesisRequest
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    app = FastAPI(title="load-per-request baseline")

    def pcm_chunks(body: Body) -> Iterator[bytes]:
        engine = CosyVoiceEngine(config)  # type: ignore[arg-type]
        engine.load()  # every request pays the load
        try:
            speaker = body.speaker or engine.voices()[0]
            req = SynthesisRequest(text=body.text, mode="sft", speaker=speaker, stream=body.stream)
            for chunk in engine.synthesize(req, threading.Event()):
                yield chunk.to_bytes()
        finally:
            engine.close()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/tts")
    def tts(body: Body) -> Response:
        if body.stream:
            return StreamingResponse(pcm_chunks(body), media_type="application/octet-stream")
        return Response(b"".join(pcm_chunks(body)), media_type="application/octet-stream")

    return app


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__ or "", argv)
    serve(build_app(engine_config(args)), args.port)


if __name__ == "__main__":
    main()
