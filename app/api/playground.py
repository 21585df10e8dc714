"""The web playground: ``GET /`` and its static assets under ``/playground/`` (no build step).

Plain HTML, CSS and one JavaScript file in ``app/playground/``; the page calls the
public API (``/v1/speakers``, ``/v1/tts``, ``/v1/voices``) like any client, with
the API key the user typed when keys are on.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.responses import FileResponse
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parents[1] / "playground"

router = APIRouter(include_in_schema=False)


@router.get("/")
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def mount(app: FastAPI) -> None:
    app.mount("/playground", StaticFiles(directory=STATIC_DIR), name="playground")
