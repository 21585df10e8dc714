"""Third-party warnings a user of ``cosyserve serve`` must not see, silenced one by one.

CosyVoice's own code and the packages it pins emit deprecation warnings about *their* code,
which a user can do nothing about and we cannot fix here (no vendored upstream code). Each is
silenced by its message and the module it is attributed to, nothing broader, so any other
warning (ours included) still shows. pyproject.toml's pytest ``filterwarnings`` lists the
same ones (pytest resets the filters for every test).

Installed once, from :func:`app.engines.cosyvoice.shims.prepare_imports`, before CosyVoice
is imported.
"""

from __future__ import annotations

import warnings

# (message regex, category, module regex): the module the warning is attributed to
THIRD_PARTY_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    # diffusers 0.29 (pinned: matcha imports it): matcha's decoder builds LoRACompatibleLinear layers,
    # which diffusers deprecated in favour of its PEFT backend. Once per model load.
    (r"`LoRACompatibleLinear` is deprecated", FutureWarning, r"diffusers\.models\.lora\Z"),
    # CosyVoice (installed package and upstream checkout alike) enters torch.cuda.amp.autocast(...)
    # around every LLM / flow / HiFT call; torch 2.4+ deprecated it for torch.amp.autocast("cuda").
    # Once, at the first request.
    (r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", FutureWarning, r"cosyvoice\.cli\.model\Z"),
)


def silence_third_party_warnings() -> None:
    """Ignore exactly :data:`THIRD_PARTY_WARNINGS` (idempotent: Python drops a duplicate filter)."""
    for message, category, module in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
