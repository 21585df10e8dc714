"""CosyVoice's own LLM decoding as the reference, and our batched scheduler over the same weights: the
tests that compare the two token for token (in-process, and in a subprocess on an upstream checkout).

Imports torch: import it after ``pytest.importorskip("torch")``. The GPU check (bench/gpu_check.py) uses it too.
"""

from __future__ import annotations

import torch

from app.engines.base import SynthesisRequest


def llm_inputs(engine, req: SynthesisRequest) -> dict:
    (model_input,) = list(engine.inputs.for_request(req, engine.sample_rate))
    return model_input


def reference(engine, model_input: dict, greedy: bool = False) -> tuple[list[int], list]:
    """CosyVoice's own llm.inference alone: its tokens and every step's log-probs (fp32, on the CPU);
    ``greedy``: with ranked greedy decoding in place of the LLM's own sampling for the call."""
    from app.engines.cosyvoice.llm.sampling import ranked_greedy

    llm = engine.loaded.model.llm
    steps: list = []
    hook = llm.llm_decoder.register_forward_hook(lambda m, i, o: steps.append(o.float().log_softmax(-1)[0].cpu()))
    empty = torch.zeros(1, 0, dtype=torch.int32)
    prompt_text = model_input.get("prompt_text", empty)
    speech = model_input.get("llm_prompt_speech_token", empty)
    saved = llm.sampling
    if greedy:
        llm.sampling = ranked_greedy()
    try:
        with torch.inference_mode():
            tokens = [int(t) for t in llm.inference(
                text=model_input["text"], text_len=torch.tensor([model_input["text"].shape[1]], dtype=torch.int32),
                prompt_text=prompt_text, prompt_text_len=torch.tensor([prompt_text.shape[1]], dtype=torch.int32),
                prompt_speech_token=speech, prompt_speech_token_len=torch.tensor([speech.shape[1]], dtype=torch.int32),
                embedding=model_input.get("llm_embedding", torch.zeros(0, 192)))]
    finally:
        hook.remove()
        llm.sampling = saved
    return tokens, steps


def make_scheduler(engine, greedy: bool = True, max_batch_size: int = 16, observer=None):
    from app.engines.cosyvoice.llm.forward import BatchedLM
    from app.engines.cosyvoice.llm.sampling import SamplingRules
    from app.engines.cosyvoice.llm.scheduler import LLMScheduler

    lm = BatchedLM(engine.loaded.model.llm)
    sched = LLMScheduler(lm, max_batch_size=max_batch_size, trace_logp=True, observer=observer,
                         rules=SamplingRules.from_llm(lm.llm, greedy=greedy))
    sched.start()
    return lm, sched


def submit(lm, sched, model_input: dict, **kw):
    """``model_input``'s prefix into ``sched`` (on a CUDA device, with the event its prefill waits for)."""
    from app.engines.cosyvoice.device import ready_event

    empty = torch.zeros(1, 0, dtype=torch.int32)
    with torch.inference_mode():
        x, lo, hi = lm.prefix(model_input["text"], model_input.get("prompt_text", empty),
                              model_input.get("llm_prompt_speech_token", empty))
    return sched.submit(x, lo, hi, ready=ready_event(x.device), **kw)
