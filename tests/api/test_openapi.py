"""/openapi.json documents every request body and every error response (schemathesis checks the rest)."""

from __future__ import annotations

from app.api.routes import SYNTHESIS_ROUTES


def test_every_synthesis_operation_documents_its_body_and_errors(client):
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    assert {"ErrorEnvelope", "OpenAIErrorEnvelope", "TTSRequest", "SpeechRequest"} <= set(components)
    for route in SYNTHESIS_ROUTES:
        for method in route.methods:
            op = schema["paths"][route.path][method.lower()]
            documented = op.get("requestBody", {}).get("content") or op.get("parameters")
            assert documented, (method, route.path)
            for status in ("400", "500", "503"):
                ref = op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("ErrorEnvelope"), (route.path, status)
            assert "Retry-After" in op["responses"]["503"]["headers"]


def test_native_body_has_json_and_multipart_with_examples(client):
    op = client.get("/openapi.json").json()["paths"]["/v1/tts"]["post"]
    content = op["requestBody"]["content"]
    assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/TTSRequest"}
    assert "hello" in content["application/json"]["examples"]
    form = content["multipart/form-data"]["schema"]["properties"]
    assert form["prompt_audio"] == {"type": "string", "format": "binary", "description": form["prompt_audio"]["description"]}
    assert form["speed"]["minimum"] == 0.25 and "null" not in str(form["mode"])
    assert op["responses"]["408"]["description"].startswith("The request body")


def test_openai_errors_use_the_openai_envelope(client):
    op = client.get("/openapi.json").json()["paths"]["/v1/audio/speech"]["post"]
    assert op["responses"]["404"]["content"]["application/json"]["schema"]["$ref"].endswith("OpenAIErrorEnvelope")
    assert "text/event-stream" in op["responses"]["200"]["content"]


def test_voice_registration_documents_the_upload(client):
    op = client.get("/openapi.json").json()["paths"]["/v1/voices"]["post"]
    form = op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert {"audio", "name", "transcript"} <= set(form["required"])
    assert {"201", "409", "413"} <= set(op["responses"])
