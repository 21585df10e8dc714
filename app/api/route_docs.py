"""The OpenAPI description of each speech and voice route (bodies, responses, examples).

Kept apart from the routers so they stay parse -> service -> response. Built
from the same pydantic models the routes validate with (see ``app/api/openapi.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.responses import Response

from app.api import openapi as doc
from app.api.openai_schemas import SpeechRequest
from app.api.schemas import TTSRequest
from app.api.voice_schemas import VoiceCard, VoiceForm
from app.audio.formats import FORMATS

AUDIO_TYPES = sorted({f.content_type for f in FORMATS.values()})
UPSTREAM_MEDIA_TYPE = "application/octet-stream"

TTS_DOC: dict[str, Any] = {
    "openapi_extra": {"parameters": [doc.PRIORITY_HEADER], **doc.body({
        **doc.json_body(TTSRequest, examples={
            "hello": {"text": "Hello there!"},
            "stream_pcm": {"text": "Streaming as it is synthesised.", "stream": True, "format": "pcm"},
            "mp3_faster": {"text": "Hello!", "speaker": "a preset speaker", "format": "mp3", "speed": 1.1},
            "bulk": {"text": "Chapter one. It was a bright cold day.", "format": "mp3", "priority": "bulk"},
            "phone_mulaw": {"text": "Thanks for calling.", "stream": True, "format": "mulaw"},
        }),
        **doc.form_body(TTSRequest, files={"prompt_audio": "1-30 s of speech to clone (any common format)",
                                           "source_audio": "Speech to convert (mode vc)"},
                        example={"text": "Hello!", "prompt_text": "the words spoken in prompt_audio"}),
    })},
    "response_class": Response,
    "responses": {**doc.audio_response(*AUDIO_TYPES), **doc.errors(*doc.SPEECH_ERRORS)},
}

SPEECH_DOC: dict[str, Any] = {
    "openapi_extra": {"parameters": [doc.PRIORITY_HEADER], **doc.body(doc.json_body(SpeechRequest, examples={
        "mp3": {"model": "tts-1", "input": "Hello!", "voice": "alloy"},
        "sse_pcm": {"model": "tts-1", "input": "Hello!", "voice": "alloy", "response_format": "pcm",
                    "stream_format": "sse"},
        "bulk": {"model": "tts-1", "input": "Chapter one.", "voice": "alloy", "priority": "bulk"},
    }))},
    "response_class": Response,
    "responses": {**doc.audio_response(*AUDIO_TYPES, sse="stream_format sse: speech.audio.delta events "
                                       "({type, audio: base64}), then one speech.audio.done ({type, usage})"),
                  **doc.errors(400, 404, 405, 408, 413, 500, 503, 504, openai=True)},
}


def upstream_doc(form: type[BaseModel], prompt: bool) -> dict[str, Any]:
    """GET and POST of one upstream endpoint: a form body (files need multipart), or query fields on GET."""
    files = {"prompt_wav": "1-30 s of speech (the prompt)"} if prompt else None
    required = ("prompt_wav",) if prompt else ()
    form_content = doc.form_body(form, files=files, required_files=required, urlencoded=not prompt)
    common = {"response_class": Response,
              "responses": {**doc.audio_response(UPSTREAM_MEDIA_TYPE, description="Raw int16 mono PCM"),
                            **doc.errors(*doc.SPEECH_ERRORS)}}
    post = {**common, "openapi_extra": {"parameters": [doc.PRIORITY_HEADER], **doc.body(form_content)}}
    if prompt:
        return {"GET": post, "POST": post}
    query = {"parameters": [*doc.query_parameters(form), doc.PRIORITY_HEADER]}
    return {"GET": {**common, "openapi_extra": query}, "POST": post}


VOICE_DOC: dict[str, Any] = {
    "openapi_extra": doc.body(doc.form_body(VoiceForm, files={"audio": "1-30 s of the voice's speech"},
                                            required_files=("audio", "name", "transcript"),
                                            example={"name": "narrator", "transcript": "the words spoken"})),
    "responses": {201: {"model": VoiceCard, "description": "Registered"},
                  **doc.errors(400, 405, 408, 409, 413, 422, 500, 503, 507)},
}
