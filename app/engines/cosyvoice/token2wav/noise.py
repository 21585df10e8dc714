"""A seeded request's own noise: every random draw of its token2wav calls from its own generator.

CosyVoice's vocoder (HiFT) draws its excitation noise (``SineGen``'s additive noise, the unvoiced
source, ``SineGen2``'s initial phase) and v1's flow draws its ODE start from torch's *global*
generator, with ``torch.randn_like`` / ``torch.rand``. So a seeded request got the same speech
tokens every time but not the same waveform (two runs correlate ~0.996), and any other request's
draws moved it further. We do not patch the model's modules: while a seeded request's
``model.token2wav`` runs, :class:`RequestNoise` (a ``TorchFunctionMode``, which torch keeps per
thread, so other requests' slot threads are untouched) answers those calls from the request's
own CPU generator and moves the result to the tensor's device. The draws are then the same on any
device and beside any other traffic; calls that take their own ``generator`` are left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

NOISE_STREAM = 0x5EED_0F_4F1  # mixed into the seed: the noise stream differs from the LLM sampler's


def _shape_of(args: tuple) -> tuple[int, ...]:
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return tuple(args[0])
    return tuple(int(a) for a in args)


class RequestNoise(TorchFunctionMode):
    """Route ``torch.randn_like``, ``rand_like``, ``randn`` and ``rand`` to one generator (this thread only)."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator
        self.draws = 0  # calls answered (tests: the model did draw through us)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if kwargs.get("generator") is None:
            if func is torch.randn_like or func is torch.rand_like:
                like = args[0]
                draw = torch.randn if func is torch.randn_like else torch.rand
                return self._draw(draw, tuple(like.shape), kwargs.get("dtype") or like.dtype,
                                  kwargs.get("device") or like.device)
            if func is torch.randn or func is torch.rand:
                if "out" not in kwargs and "size" not in kwargs:
                    return self._draw(func, _shape_of(args), kwargs.get("dtype") or torch.get_default_dtype(),
                                      kwargs.get("device") or torch.device("cpu"))
        return func(*args, **kwargs)

    def _draw(self, draw: Any, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        self.draws += 1
        values = draw(shape, generator=self.generator, dtype=torch.float32)  # fp32 on the CPU: device-independent
        return values.to(device=device, dtype=dtype)


def noise_generator(seed: int) -> torch.Generator:
    """The generator of a request's noise: a function of its seed only."""
    return torch.Generator().manual_seed((int(seed) ^ NOISE_STREAM) & 0xFFFF_FFFF_FFFF_FFFF)


@contextlib.contextmanager
def request_noise(generator: torch.Generator | None) -> Iterator[RequestNoise | None]:
    """Draw from ``generator`` while the block runs in this thread (None: the global generator, as upstream)."""
    if generator is None:
        yield None
        return
    with RequestNoise(generator) as mode:
        yield mode
