"""The third-party warnings `cosyserve serve` silences: exactly those, by message and module, nothing else."""

from __future__ import annotations

import warnings

import pytest

from app.engines.cosyvoice.quiet import (
    THIRD_PARTY_WARNINGS,
    silence_third_party_warnings,
)

LORA = ("`LoRACompatibleLinear` is deprecated and will be removed in version 1.0.0. Use of `LoRACompatibleLinear` "
        "is deprecated. Please switch to PEFT backend by installing PEFT: `pip install peft`.")
AUTOCAST = "`torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)` instead."


def shown(message: str, category: type[Warning], module: str) -> bool:
    """Whether a warning attributed to ``module`` gets through once the filters are installed."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        silence_third_party_warnings()
        silence_third_party_warnings()  # idempotent
        warnings.warn_explicit(message, category, filename=module.replace(".", "/") + ".py", lineno=1, module=module)
    return len(seen) == 1


@pytest.mark.parametrize("message, category, module", [
    (LORA, FutureWarning, "diffusers.models.lora"),
    (AUTOCAST, FutureWarning, "cosyvoice.cli.model"),
])
def test_the_named_warnings_are_silenced(message, category, module):
    assert not shown(message, category, module)


@pytest.mark.parametrize("message, category, module", [
    (AUTOCAST, FutureWarning, "app.engines.cosyvoice.engine"),  # the same deprecation in our code shows
    (AUTOCAST, FutureWarning, "cosyvoice.cli.model_extra"),  # the module must match whole
    ("`past_key_values` is deprecated", FutureWarning, "cosyvoice.cli.model"),  # another message from that module
    (LORA, DeprecationWarning, "diffusers.models.lora"),  # another category
    ("something else", UserWarning, "diffusers.models.lora"),
])
def test_everything_else_still_shows(message, category, module):
    assert shown(message, category, module)


def test_the_filters_do_not_leak_out_of_a_catch_warnings_block():
    before = list(warnings.filters)
    shown(LORA, FutureWarning, "diffusers.models.lora")
    assert warnings.filters == before
    assert len(THIRD_PARTY_WARNINGS) == len({m for m, _, _ in THIRD_PARTY_WARNINGS})
