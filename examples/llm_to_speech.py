"""Pipe a language model's streamed answer into cosyserve's WebSocket and save what it says.

    python examples/llm_to_speech.py --out answer.wav                       # a simulated LLM (20 tokens/s)
    python examples/llm_to_speech.py --llm-url http://localhost:8001/v1 --llm-model qwen2.5 \
        --prompt "Tell me about otters." --out answer.wav                 # any OpenAI-compatible chat API

Text goes to the server token by token as the LLM writes it; audio comes back while the
LLM is still writing (on CosyVoice2/3: mid-sentence). Needs `websockets` (and `openai`
for --llm-url). Protocol: docs/api.md; walkthrough: docs/agents.md.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
import wave
from collections.abc import Iterator

from websockets.sync.client import connect

ANSWER = ("Otters are playful, social animals. They float on their backs, hold hands while they sleep, "
          "and use stones as tools to open shells.")


def simulated_llm(text: str = ANSWER, tokens_per_s: float = 20.0) -> Iterator[str]:
    """Yields an answer a token (a word or punctuation mark) at a time, at an LLM's pace."""
    for token in re.findall(r"\s*\w+|\s*[^\w\s]", text):
        time.sleep(1.0 / tokens_per_s)
        yield token


def openai_llm(base_url: str, model: str, prompt: str) -> Iterator[str]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused")
    for chunk in client.chat.completions.create(model=model, stream=True,
                                                messages=[{"role": "user", "content": prompt}]):
        if chunk.choices and chunk.choices[0].delta.content:
            yield chunk.choices[0].delta.content


def speak(server: str, tokens: Iterator[str], voice: str | None = None, api_key: str | None = None) -> tuple[bytes, int, dict]:
    """Stream ``tokens`` into one utterance; returns (pcm bytes, sample rate, audio.done)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    with connect(server.rstrip("/") + "/v1/audio/speech/stream", additional_headers=headers) as ws:
        config = {"type": "session.config", "response_format": "pcm"}
        if voice:
            config["voice"] = voice
        ws.send(json.dumps(config))

        def send_text() -> None:
            for token in tokens:
                ws.send(json.dumps({"type": "input.text", "text": token}))
            ws.send(json.dumps({"type": "session.close"}))  # speak the rest, then end the session

        writer = threading.Thread(target=send_text, daemon=True)
        writer.start()
        pcm, rate, done, started = bytearray(), 0, {}, time.monotonic()
        for message in ws:  # ends when the server closes the session
            if isinstance(message, bytes):
                if not pcm:
                    print(f"first audio after {time.monotonic() - started:.2f} s")
                pcm += message
                continue
            event = json.loads(message)
            if event["type"] == "audio.start":
                rate = event["sample_rate"]
            elif event["type"] == "audio.done":
                done = event
            elif event["type"] == "error":
                raise RuntimeError(event["error"])
        writer.join()
    return bytes(pcm), rate, done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default="ws://127.0.0.1:8000")
    ap.add_argument("--voice", default=None, help="a library voice or preset speaker")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--llm-url", default=None, help="an OpenAI-compatible API; default: a simulated LLM")
    ap.add_argument("--llm-model", default="default")
    ap.add_argument("--prompt", default="Tell me about otters.")
    ap.add_argument("--out", default="answer.wav")
    args = ap.parse_args()
    tokens = openai_llm(args.llm_url, args.llm_model, args.prompt) if args.llm_url else simulated_llm()
    pcm, rate, done = speak(args.server, tokens, args.voice, args.api_key)
    with wave.open(args.out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm)
    print(f"{done.get('audio_seconds', 0):.2f} s of audio -> {args.out}")


if __name__ == "__main__":
    main()
