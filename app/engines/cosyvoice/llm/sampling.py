"""Per-sequence speech-token sampling with CosyVoice's rules, a random generator per sequence.

CosyVoice2/3 sample with "repetition aware sampling" (``ras_sampling``, its
parameters in the model's yaml): nucleus sampling over the ``top_k`` most likely
tokens while their cumulative probability is below ``top_p``; if the picked token
already occurs ``>= win_size * tau_r`` times in the last ``win_size`` decoded
tokens, it is re-drawn from the whole distribution. End-of-speech is masked until
the sequence reaches its minimum length.

We implement those rules ourselves so that each sequence draws from its own
``torch.Generator``: a request's output then depends on its seed only, not on
which other requests share the batch or in which order they arrived.
``greedy`` (testing) takes the most likely allowed token instead.

Sampling runs on the host, always: the scheduler copies each step's log-probs off
the device once (fp32) and a :class:`Sampler` (a CPU generator) refuses any other
tensor. So a seeded request draws the same numbers on a CPU and a GPU server, and
the sampling code never makes the GPU wait (every ``int()`` here reads host memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingRules:
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1
    greedy: bool = False

    @classmethod
    def from_llm(cls, llm: Any, greedy: bool = False) -> SamplingRules:
        """Read the yaml's ``ras_sampling`` parameters (a functools.partial on the LLM)."""
        kw = dict(getattr(getattr(llm, "sampling", None), "keywords", None) or {})
        base = cls()
        return cls(
            top_p=float(kw.get("top_p", base.top_p)),
            top_k=int(kw.get("top_k", base.top_k)),
            win_size=int(kw.get("win_size", base.win_size)),
            tau_r=float(kw.get("tau_r", base.tau_r)),
            greedy=greedy,
        )


def nucleus_support(probs: Any, top_p: float, top_k: int) -> tuple[Any, Any]:
    """The tokens nucleus sampling may pick and their (unnormalised) probabilities.

    A token is kept while fewer than ``top_k`` are kept and the probability mass of
    the more likely ones is still below ``top_p`` (so the first one always is).
    """
    import torch

    values, order = probs.sort(descending=True, stable=True)
    k = min(top_k, values.shape[0])
    values, order = values[:k], order[:k]
    before = torch.cumsum(values, 0) - values
    kept = max(1, int((before < top_p).sum()))  # ``before`` only grows: the kept tokens are a prefix
    return order[:kept], values[:kept]


class Sampler:
    """Samples one sequence's next token from its log-probabilities."""

    def __init__(self, rules: SamplingRules, eos_token: int, seed: int | None = None) -> None:
        import torch

        self.rules = rules
        self.eos_token = eos_token
        self.generator = torch.Generator(device="cpu")
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(seed))

    def sample(self, logp: Any, decoded: list[int], ignore_eos: bool) -> int:
        """The next token from ``logp``, a host (CPU) tensor of one sequence's log-probs ``[V]``."""
        import torch

        if logp.device.type != "cpu":
            raise ValueError(f"Sampler samples host tensors only; got one on {logp.device} "
                             "(the scheduler copies each step's log-probs to the host once)")
        if ignore_eos:
            logp = logp.clone()
            logp[self.eos_token] = float("-inf")
        if self.rules.greedy:
            return int(torch.argmax(logp))
        probs = logp.softmax(dim=0)
        ids, weights = nucleus_support(probs, self.rules.top_p, self.rules.top_k)
        token = int(ids[torch.multinomial(weights, 1, generator=self.generator)])
        window = decoded[-self.rules.win_size:]
        if window and window.count(token) >= self.rules.win_size * self.rules.tau_r:
            token = int(torch.multinomial(probs, 1, generator=self.generator))
        return token


def ranked_greedy() -> Any:
    """A stand-in for CosyVoice's own sampling function that makes its ``llm.inference`` deterministic.

    It returns the most likely token; called again for the same step (CosyVoice
    re-draws while it gets a token it must not take yet), the next most likely one.
    So it picks the most likely *allowed* token, like ``SamplingRules(greedy=True)``.
    """
    import torch

    state: dict[str, Any] = {"key": None, "rank": 0}

    def sample(weighted_scores: Any, decoded_tokens: list, sampling: Any = None) -> Any:
        finite = weighted_scores[torch.isfinite(weighted_scores)]
        key = (len(decoded_tokens), float(finite.sum()))
        state["rank"] = state["rank"] + 1 if state["key"] == key else 0
        state["key"] = key
        order = weighted_scores.argsort(descending=True, stable=True)
        return order[min(state["rank"], order.shape[0] - 1)].reshape(1)

    return sample
