"""Our own forward pass over CosyVoice2/3's speech-token LLM, for many sequences at once.

CosyVoice2 (``Qwen2LM``) and CosyVoice3 (``CosyVoice3LM``) decode speech tokens
with a Qwen2 backbone (``llm.llm.model``, a transformers ``Qwen2ForCausalLM``),
their own input embeddings (text: the backbone's ``embed_tokens``; speech:
``speech_embedding``; start/task markers: ``llm_embedding`` in v2,
``speech_embedding`` in v3) and a speech-token head (``llm_decoder``). We reuse
those modules and their weights as they are, and run the decoder layers
ourselves over a :class:`~app.engines.cosyvoice.llm.kv.BatchedKV`, so one step
serves every running sequence whatever its length:

* ``prefill_many`` runs several sequences' inputs in one forward (their real
  tokens packed for the projections and MLPs, attention per row right-padded
  with a causal mask, each at its own positions, after its own saved past if it
  has one) and stores each one's keys/values in a new cache row;
* ``decode`` runs one new token for every row, each at its own position, each
  attending to its own filled positions only (a length mask).

Host and device: the lengths live on the host (``BatchedKV.lengths``); a step uploads
its token ids and positions in one asynchronous copy (``StepIO.upload``) and reads
nothing back: no ``int()``/``.item()``, no boolean-mask indexing on device tensors, so
the step queues its kernels without waiting for the GPU. Its log-probs stay on the
device; the scheduler downloads them once. In half precision (``engine.dtype``) the
attention softmax and the log-probs are computed in fp32.

The math is that of the transformers Qwen2 layer (RMSNorm, rotary embeddings
from the backbone's own ``rotary_emb``, grouped-query attention, SwiGLU MLP),
checked against CosyVoice's own ``llm.inference`` to 1e-4 in the tests.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from app.engines.cosyvoice.device import StepIO, to_device
from app.engines.cosyvoice.layout import ENDOFPROMPT_ID
from app.engines.cosyvoice.llm.kv import BatchedKV, SavedRow


@dataclass(frozen=True)
class LMSpec:
    """What differs between the LLM families, read from the loaded module."""

    family: str  # "Qwen2LM" | "CosyVoice3LM"
    speech_token_size: int
    eos_token: int  # masked while a sequence is shorter than its minimum length
    stop_tokens: frozenset[int]  # any of these ends a sequence
    min_token_text_ratio: float
    max_token_text_ratio: float
    marker_ids: tuple[int, int]  # (sos, task_id) rows of the marker embedding table
    needs_endofprompt: bool  # v3 asserts <|endofprompt|> (id 151646) is in the text
    fill_token: int = -1  # bistream: "next text block, please" (v2: size + 2, v3: size + 3)
    mix_ratio: tuple[int, int] = (5, 15)  # bistream: text tokens, then speech tokens, per block


def supports_batching(llm: Any) -> bool:
    """True for the Qwen2-backed LLMs of CosyVoice2/3 (not v1's TransformerLM)."""
    backbone = getattr(getattr(getattr(llm, "llm", None), "model", None), "model", None)
    return (
        type(llm).__name__ in ("Qwen2LM", "CosyVoice3LM")
        and backbone is not None
        and hasattr(backbone, "layers")
        and hasattr(backbone, "rotary_emb")
        and hasattr(llm, "speech_embedding")
        and hasattr(llm, "llm_decoder")
    )


def _inference_defaults(llm: Any) -> dict[str, Any]:
    try:
        params = inspect.signature(llm.inference).parameters
    except (TypeError, ValueError):
        return {}
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def lm_spec(llm: Any) -> LMSpec:
    family = type(llm).__name__
    size = int(llm.speech_token_size)
    defaults = _inference_defaults(llm)
    stops = getattr(llm, "stop_token_ids", None) or [size + i for i in range(3)]
    if family == "CosyVoice3LM":
        markers = (int(llm.sos), int(llm.task_id))
    else:
        markers = (int(getattr(llm, "sos", getattr(llm, "sos_eos", 0))), int(getattr(llm, "task_id", 1)))
    fill = int(getattr(llm, "fill_token", -1))
    if fill < size:  # older copies keep a marker-table index there; the decoder's fill id is size + 2
        fill = size + 2
    mix = tuple(int(x) for x in (getattr(llm, "mix_ratio", None) or (5, 15)))
    return LMSpec(
        fill_token=fill,
        mix_ratio=(mix[0], mix[1]),
        family=family,
        speech_token_size=size,
        eos_token=size,  # what CosyVoice masks before min_len (sampling_ids)
        stop_tokens=frozenset(int(t) for t in stops),
        min_token_text_ratio=float(defaults.get("min_token_text_ratio", 2)),
        max_token_text_ratio=float(defaults.get("max_token_text_ratio", 20)),
        marker_ids=markers,
        needs_endofprompt=family == "CosyVoice3LM",
    )


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class BatchedLM:
    """Prefill and batched decode over one loaded CosyVoice2/3 LLM (inference only)."""

    def __init__(self, llm: Any) -> None:
        if not supports_batching(llm):
            raise TypeError(f"{type(llm).__name__} is not a Qwen2-backed CosyVoice LLM")
        self.llm = llm
        self.spec = lm_spec(llm)
        self.backbone = llm.llm.model.model  # transformers Qwen2Model
        cfg = llm.llm.model.config
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.hidden = int(cfg.hidden_size)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim ** -0.5
        self.layers = list(self.backbone.layers)
        weight = llm.llm_decoder.weight
        self.dtype, self.device = weight.dtype, weight.device
        self.io = StepIO(self.device)  # the step's uploads/downloads and (CUDA) its own stream

    def new_cache(self) -> BatchedKV:
        return BatchedKV(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    # -- inputs ------------------------------------------------------------------------------------
    def prefix(self, text: Any, prompt_text: Any, prompt_speech_token: Any) -> tuple[Any, int, int]:
        """The LLM input of one request ``[1, P, D]`` and its (min_len, max_len) in speech tokens.

        Layout, as CosyVoice2/3 build it: start marker, prompt text + text embeddings,
        task marker, prompt speech token embeddings.
        """
        import torch

        spec = self.spec
        tokens = torch.cat([prompt_text.to(text.device), text], dim=1)
        if spec.needs_endofprompt and not bool((tokens.cpu() == ENDOFPROMPT_ID).any()):  # a host check
            raise ValueError("CosyVoice3 needs <|endofprompt|> in the text or the prompt text")
        text_emb = self.backbone.embed_tokens(to_device(tokens, self.device))
        table = self.llm.speech_embedding.weight if spec.family == "CosyVoice3LM" else self.llm.llm_embedding.weight
        sos = table[spec.marker_ids[0]].reshape(1, 1, -1)
        task = table[spec.marker_ids[1]].reshape(1, 1, -1)
        parts = [sos, text_emb, task]
        if prompt_speech_token is not None and prompt_speech_token.shape[1] > 0:
            parts.append(self.llm.speech_embedding(to_device(prompt_speech_token, self.device)))
        lm_input = torch.cat(parts, dim=1).to(self.dtype)
        n_text = int(text.shape[1])
        return lm_input, int(n_text * spec.min_token_text_ratio), int(n_text * spec.max_token_text_ratio)

    def token_embeddings(self, ids: Any) -> Any:
        """Speech-token embeddings ``[n, 1, D]`` of ``ids`` (a device tensor of n ids)."""
        return self.llm.speech_embedding.weight[ids].unsqueeze(1)

    def resume_input(self, lm_input: Any, tokens: list[int]) -> Any:
        """The input that rebuilds a sequence's cache after it was taken out of the batch.

        ``lm_input`` and every decoded token but the last (the last one is fed by the next step).
        """
        import torch

        if len(tokens) <= 1:
            return lm_input
        emb = self.token_embeddings(self.io.upload(tokens[:-1])).transpose(0, 1)  # [1, k, D]
        return torch.cat([lm_input, emb.to(lm_input.dtype)], dim=1)

    # -- forward ---------------------------------------------------------------------------------
    def _qkv(self, layer: Any, x: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
        """x [n, T, D] -> q [n, H, T, hd], k/v [n, KV, T, hd] with rotary embeddings applied."""
        attn = layer.self_attn
        n, t, _ = x.shape
        q = attn.q_proj(x).view(n, t, self.heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(n, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(n, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def _attend(self, q: Any, k: Any, v: Any, bias: Any) -> Any:
        """Grouped-query attention: q [n, H, T, hd], k/v [n, KV, L, hd], bias [n, 1, T, L] -> [n, T, H*hd]."""
        import torch

        n, _, t, _ = q.shape
        qg = q.reshape(n, self.kv_heads, self.groups * t, self.head_dim)
        scores = (qg @ k.transpose(-1, -2)) * self.scaling  # [n, KV, G*T, L]
        scores = scores.view(n, self.kv_heads, self.groups, t, -1) + bias.unsqueeze(1)
        weights = scores.softmax(dim=-1) if scores.dtype == torch.float32 else scores.float().softmax(-1).to(v.dtype)
        out = weights.view(n, self.kv_heads, self.groups * t, -1) @ v  # [n, KV, G*T, hd]
        return out.view(n, self.heads, t, self.head_dim).transpose(1, 2).reshape(n, t, self.heads * self.head_dim)

    def _block(self, layer: Any, x: Any, attn_out: Any) -> Any:
        h = x + layer.self_attn.o_proj(attn_out)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _logp(self, h: Any) -> Any:
        return self.llm.llm_decoder(self.backbone.norm(h)).float().log_softmax(dim=-1)

    def check_input(self, lm_input: Any) -> None:
        """Refuse an input that cannot join a prefill (shape, device): a host check, no sync."""
        shape = tuple(getattr(lm_input, "shape", ()))
        if len(shape) != 3 or shape[0] != 1 or shape[1] < 1 or shape[2] != self.hidden:
            raise ValueError(f"an LLM input must be [1, T >= 1, {self.hidden}], not {list(shape)}")
        if lm_input.device != self.device:
            raise ValueError(f"an LLM input on {lm_input.device} for an LLM on {self.device}")

    def prefill(self, kv: BatchedKV, lm_input: Any, past: SavedRow | None = None) -> tuple[int, Any]:
        """Run one sequence's input (after ``past``, a saved cache row); returns its row and next log-probs [V]."""
        rows, logp = self.prefill_many(kv, [(lm_input, past)])
        return rows[0], logp[0]

    def prefill_many(self, kv: BatchedKV, items: list[tuple[Any, SavedRow | None]]) -> tuple[list[int], Any]:
        """Several sequences' inputs in ONE forward: their new cache rows and next log-probs ``[n, V]`` (device).

        ``items``: per sequence its input ``[1, T_i, D]`` and ``past``, a saved cache row the input
        follows (a bistream sequence back with more text: positions ``past.length`` on), or None.
        The projections, norms and MLPs run over the real tokens only, packed ``[1, sum T_i, D]``
        (no padding to compute); attention runs per row, right-padded to the longest input: row i
        at its own rotary positions, each real position attending to its own past and its own
        earlier positions only (causal mask per row; padded queries see the row's real keys, so
        nothing is all-masked, and are dropped). Only real positions are written to the new rows
        (appended after the running ones, in order). The log-probs are each row's after its last
        real position. On an error the new rows are removed again: the cache is as before and
        the ``past`` rows are untouched.
        """
        import torch

        if not items:
            raise ValueError("prefill_many needs at least one input")
        n = len(items)
        inputs = [x.to(self.dtype) for x, _ in items]
        lengths = [int(x.shape[1]) for x in inputs]
        starts = [past.length if past is not None else 0 for _, past in items]
        ends = [s + t for s, t in zip(starts, lengths)]
        total, width, span = sum(lengths), max(lengths), max(ends)  # real tokens; padded queries; keys at most
        rows = kv.add_rows(ends)
        try:
            for row, (_, past) in zip(rows, items):
                if past is not None:
                    kv.restore(row, past)
            x = torch.cat(inputs, dim=1) if n > 1 else inputs[0]  # [1, total, D]
            # host-made indices, ONE upload: per real token its position (rotary and cache slot), its cache
            # row and its place among the padded queries [n * width]; per padded query the last key it may
            # see; per input its last real token
            ends_packed = [sum(lengths[:i + 1]) - 1 for i in range(n)]
            flat = self.io.upload([s + j for s, t in zip(starts, lengths) for j in range(t)]
                                  + [r for r, t in zip(rows, lengths) for _ in range(t)]
                                  + [i * width + j for i, t in enumerate(lengths) for j in range(t)]
                                  + [min(s + j, e - 1) for s, e in zip(starts, ends) for j in range(width)]
                                  + ends_packed)
            pos, row_t, query_t, sees, last_t = flat.split([total, total, total, n * width, n])
            cos, sin = self.backbone.rotary_emb(x, pos.unsqueeze(0))
            bias = torch.zeros((n, width, span), dtype=self.dtype, device=self.device)
            bias.masked_fill_(torch.arange(span, device=self.device) > sees.view(n, width, 1), float("-inf"))
            bias = bias.view(n, 1, width, span)
            padded = any(t != width for t in lengths)
            for i, layer in enumerate(self.layers):
                q, k, v = self._qkv(layer, layer.input_layernorm(x), cos, sin)  # q [1, H, total, hd]
                kv.write_step(i, pos, k[0].transpose(0, 1), v[0].transpose(0, 1), rows=row_t)
                keys, values = kv.rows_view(i, rows[0], n, span)
                out = self._attend(self._rows_of(q, n, width, query_t, padded), keys, values, bias)
                out = out.reshape(n * width, -1)
                x = self._block(layer, x, (out[query_t] if padded else out).unsqueeze(0))
            return rows, self._logp(x[0, last_t])
        except BaseException:
            for row in reversed(rows):  # the last rows: nothing moves
                kv.remove_row(row)
            raise

    @staticmethod
    def _rows_of(q: Any, n: int, width: int, places: Any, padded: bool) -> Any:
        """Packed queries ``[1, H, total, hd]`` -> per row, right-padded ``[n, H, width, hd]`` (zeros at the pads)."""
        _, heads, total, hd = q.shape
        tokens = q[0].transpose(0, 1)  # [total, H, hd]
        if padded:
            tokens = tokens.new_zeros(n * width, heads, hd).index_copy_(0, places, tokens)
        return tokens.reshape(n, width, heads, hd).transpose(1, 2)

    def embed(self, parts: list[tuple]) -> Any:
        """Embeddings ``[1, T, D]`` of bistream input parts: markers, text ids, speech ids."""
        import torch

        table = self.llm.speech_embedding.weight if self.spec.family == "CosyVoice3LM" else self.llm.llm_embedding.weight
        out = []
        for kind, value in parts:
            if kind == "marker":
                out.append(table[self.spec.marker_ids[value]].reshape(1, 1, -1))
            elif value:
                ids = self.io.upload([value])
                emb = self.backbone.embed_tokens(ids) if kind == "text" else self.llm.speech_embedding(ids)
                out.append(emb)
        return torch.cat(out, dim=1).to(self.dtype)

    def decode(self, kv: BatchedKV, tokens: list[int], rows: int | None = None) -> Any:
        """One step for every running row (``tokens[r]`` is row r's last token): log-probs [n, V] on the device.

        ``rows``: step only rows ``0..rows-1`` (the scheduler keeps the rows that sit a step out,
        bulk ones, after them); the others' cache and lengths are untouched. Nothing is read
        back from the device here: the positions come from the host lengths, and ids and
        positions go up in one asynchronous copy.
        """
        import torch

        n = kv.rows if rows is None else rows
        if len(tokens) != n or not 0 < n <= kv.rows:
            raise ValueError(f"decode got {len(tokens)} tokens for {n} running sequences")
        lengths = kv.lengths[:n]
        longest = max(lengths) + 1
        kv.reserve(kv.rows, longest)
        ids, positions = self.io.upload([list(tokens), lengths])  # one copy: [2, n]
        x = self.token_embeddings(ids).to(self.dtype)
        cos, sin = self.backbone.rotary_emb(x, positions.unsqueeze(1))
        span = torch.arange(longest, device=self.device).unsqueeze(0)
        bias = torch.zeros((n, longest), dtype=self.dtype, device=self.device)
        bias.masked_fill_(span > positions.unsqueeze(1), float("-inf"))
        bias = bias.view(n, 1, 1, longest)
        rows = torch.arange(n, device=self.device)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x), cos, sin)
            kv.write_step(i, positions, k[:, :, 0], v[:, :, 0], rows=rows)
            keys, values = kv.view(i, longest, n)
            x = self._block(layer, x, self._attend(q, keys, values, bias))
        for r in range(n):
            kv.lengths[r] += 1
        return self._logp(x[:, -1])
