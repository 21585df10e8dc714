"""What the batching benchmark sends and how many: texts, systems, per-point request counts, estimate."""

from __future__ import annotations

# ~19 text tokens with the tiny/full-size BPE tokenizer -> ~38 speech tokens (~1.5 s of audio)
# with the full-size model's calibrated stop (app/engines/fullsize.py).
FULL_TEXT = "The train to the city leaves at seven every single morning."
