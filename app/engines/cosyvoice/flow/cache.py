"""Streaming flow without recomputing the prefix: per-request estimator caches between hops.

CosyVoice2's streaming ``token2wav`` runs the flow over prompt + every token so far at
each hop and keeps only the new mel. In streaming mode the flow's CFM estimator
(``CausalConditionalDecoder``) is chunk-causal: causal convolutions, per-frame norms,
and attention masked to whole chunks of ``static_chunk_size`` frames with all left
chunks visible. The ODE's noise is a fixed buffer indexed by absolute frame. So the
frames of finished chunks come out the same at every hop, and a hop that starts on a
chunk boundary can run the estimator over its *new* frames only, given, per ODE step:

* each causal convolution's last ``kernel - 1`` input frames (``_conv_pre`` / ``_conv_post``);
* each attention layer's keys and values of all earlier frames (``CachedAttention``).

The token encoder (a few percent of the flow's cost) still runs over all tokens; only
its new frames are used. CosyVoice's own ``token2wav`` still does the rest (HiFT and its
overlap cache): while a :class:`FlowStream` is bound to the thread, the wrapped
``flow.inference`` returns the new frames, left-padded to the length ``token2wav``
slices them from.

Exactness: the frames equal the recomputing path's streamed hops up to float
reassociation. The last call of a stream runs chunk-masked here, where the recomputing
path finishes with full attention; ``window_frames`` (optional) keeps only that many
cached frames per layer, bounding memory (keys + values of every layer and ODE step:
~4.6 MB per frame at full size in fp32) at the price of exactness.
Config: ``engine.flow_cache`` (off by default) and ``engine.flow_cache_window_frames``.
All streams together hold at most ``engine.flow_cache_budget_mb`` (``flow/budget.py``): a
stream that does not fit drops its cache and recomputes, as without this module.

The prompt part (``PromptCache``, ``engine.flow_prompt_cache_mb``): the estimator frames
of a prompt's complete chunks whose encoder input ends inside the prompt (chunk ``j``
of ``C`` frames needs tokens up to the end of its encoder chunk plus the 3-token
look-ahead) depend on the voice only: its prompt tokens and features, its speaker
embedding and the fixed noise. For a registered voice they are computed once (the
token encoder over the prompt tokens alone), their per-step caches kept, keyed by a
hash of those tensors, and every later stream with that voice starts after them. The
prompt's last, partial or look-ahead-dependent chunk is computed per request.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from app.engines.cosyvoice.flow.solver import MODEL_STEPS, options_of, time_grid

_local = threading.local()


def current_stream() -> FlowStream | None:
    return getattr(_local, "stream", None)


@contextlib.contextmanager
def bound_stream(stream: FlowStream | None) -> Iterator[None]:
    previous = current_stream()
    _local.stream = stream
    try:
        yield
    finally:
        _local.stream = previous


@dataclass
class FlowStream:
    """One request's flow state between hops."""

    window_frames: int | None = None
    frames_done: int = 0  # estimator frames already computed (prompt frames included)
    step: int = 0  # the ODE step now running (selects the cache slot)
    conv: dict[tuple[int, int], Any] = field(default_factory=dict)
    kv: dict[tuple[int, int], tuple[Any, Any]] = field(default_factory=dict)
    frames_computed: int = 0  # estimator frames this stream ran (what it cost)
    prompt_cache: PromptCache | None = None  # the voice's prompt part, shared across requests
    prompt_key: str | None = None  # content hash of the voice's flow inputs (None: not cached)
    prompt_frames_reused: int = 0  # estimator frames taken from the prompt cache
    first_call_frames: int | None = None  # estimator frames of the first call (the first hop's cost)
    budget: Any = None  # flow_budget.FlowCacheBudget: the bytes all streams may hold (None: no limit)
    recompute: bool = False  # the budget refused it: the rest of the stream recomputes its prefix
    kv_dtype: Any = None  # what keys/values are stored in (a torch dtype; None: as computed, fp32)
    runtime: Any = None  # onnx_stream.StreamEstimator running the estimator (None: the hooked torch modules)

    def close(self) -> None:
        """The request ended: drop the caches and give their bytes back."""
        if self.budget is not None:
            self.budget.release(id(self))
        self.conv, self.kv = {}, {}

    def drop_cache(self) -> None:
        """Stream on without a cache (refused by the budget)."""
        if self.budget is not None:
            self.budget.refuse(id(self))
        self.recompute = True
        self.conv, self.kv = {}, {}

    def nbytes(self) -> int:
        total = sum(t.numel() * t.element_size() for t in self.conv.values())
        return total + sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv.values())


@dataclass(frozen=True)
class PromptState:
    """A voice's estimator caches after its cacheable prompt frames (never mutated once stored)."""

    frames: int
    conv: dict[tuple[int, int], Any]
    kv: dict[tuple[int, int], tuple[Any, Any]]
    nbytes: int


class PromptCache:
    """Voice prompt states by content key, least recently used evicted beyond ``max_bytes``. Thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._items: OrderedDict[str, PromptState] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: str) -> PromptState | None:
        with self._lock:
            state = self._items.get(key)
            if state is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return state

    def put(self, key: str, state: PromptState) -> bool:
        """Store ``state`` (False when it alone exceeds the budget: not kept)."""
        if state.nbytes > self.max_bytes:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            self._items[key] = state
            self.bytes += state.nbytes
            while self.bytes > self.max_bytes:
                _, gone = self._items.popitem(last=False)
                self.bytes -= gone.nbytes
                self.evictions += 1
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._items


def prompt_key(prompt_token: Any, prompt_feat: Any, embedding: Any) -> str | None:
    """A hash of everything the prompt frames depend on (None without a prompt)."""
    import torch

    if prompt_token is None or prompt_token.shape[-1] == 0:
        return None
    h = hashlib.sha256()
    for t in (prompt_token, prompt_feat, embedding):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cacheable_prompt_frames(flow: Any, prompt_tokens: int) -> int:
    """Estimator frames of the prompt's leading whole chunks that depend on no generated token."""
    chunk = int(flow.decoder.estimator.static_chunk_size)
    ratio = int(getattr(flow, "token_mel_ratio", 2))
    enc_chunk = int(getattr(flow.encoder, "static_chunk_size", 0) or 0)
    look = int(flow.pre_lookahead_len)
    if enc_chunk <= 0:
        return 0  # the encoder attends over every token: every frame depends on the generated ones
    frames = 0
    while True:
        last_token = (frames + chunk - 1) // ratio  # the chunk's last frame comes from this token
        needs = (last_token // enc_chunk + 1) * enc_chunk + look  # tokens its encoder chunk + look-ahead read
        if needs > prompt_tokens:
            return frames
        frames += chunk


def supports_flow_cache(flow: Any) -> bool:
    """True for CosyVoice2's flow (chunk-causal ``CausalConditionalDecoder`` with one channel level)."""
    import torch

    estimator = getattr(getattr(flow, "decoder", None), "estimator", None)
    if type(estimator).__name__ != "CausalConditionalDecoder" or not getattr(estimator, "static_chunk_size", 0):
        return False
    if len(estimator.down_blocks) != 1 or getattr(estimator, "num_decoding_left_chunks", -1) not in (-1, None):
        return False  # strided down/up-sampling or a bounded left context: not this incremental form
    for m in estimator.modules():
        if isinstance(m, torch.nn.Conv1d) and type(m).__name__ != "CausalConv1d" and m.kernel_size[0] != 1:
            return False
        if hasattr(m, "to_k") and (getattr(m, "spatial_norm", None) is not None
                                   or getattr(m, "group_norm", None) is not None):
            return False
    return hasattr(flow, "encoder") and hasattr(flow.decoder, "rand_noise")


def project(attn: Any, hidden_states: Any) -> tuple[Any, Any, Any]:
    """A diffusers ``Attention``'s own query, key and value of ``hidden_states``, each ``[b, heads, t, hd]``."""
    b, t, _ = hidden_states.shape
    q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
    hd = k.shape[-1] // attn.heads
    return tuple(x.view(b, t, attn.heads, hd).transpose(1, 2) for x in (q, k, v))  # type: ignore[return-value]


def attend(attn: Any, q: Any, k: Any, v: Any, bias: Any, hidden_states: Any) -> Any:
    """Attention of ``q`` over ``k``/``v`` with an additive ``bias`` ``[b, 1, t, keys]`` (or None), then the
    ``Attention``'s output projection, residual and rescale, as its own processor ends."""
    import torch.nn.functional as F

    b, heads, t, hd = q.shape
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.0, is_causal=False)
    out = attn.to_out[0](out.transpose(1, 2).reshape(b, t, heads * hd).to(q.dtype))
    out = attn.to_out[1](out)
    if attn.residual_connection:
        out = out + hidden_states
    return out / attn.rescale_output_factor


def hook_estimator(estimator: Any, marker: str, conv_pre: Any, conv_post: Any, processor: Any) -> bool:
    """Hook every causal convolution (``conv_pre``/``conv_post``) and wrap every attention's processor in
    ``processor``; once per ``marker``. False: already hooked."""
    if getattr(estimator, marker, False):
        return False
    for m in estimator.modules():
        if type(m).__name__ == "CausalConv1d":
            m.register_forward_pre_hook(conv_pre)
            m.register_forward_hook(conv_post)
        if hasattr(m, "set_processor") and hasattr(m, "to_k"):
            m.set_processor(processor(m.processor))
    setattr(estimator, marker, True)
    return True


class CachedAttention:
    """An attention processor that, with a FlowStream bound, attends over cached + new frames."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, temb: Any = None, *args: Any, **kwargs: Any) -> Any:
        stream = current_stream()
        if stream is None or encoder_hidden_states is not None:
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        import torch
        import torch.nn.functional as F

        b, t, _ = hidden_states.shape
        q, k, v = project(attn, hidden_states)
        key = (stream.step, id(attn))
        cached = stream.kv.get(key)
        if cached is not None:
            k, v = torch.cat([cached[0].to(k.dtype), k], dim=2), torch.cat([cached[1].to(v.dtype), v], dim=2)
        store = (k, v) if stream.kv_dtype is None else (k.to(stream.kv_dtype), v.to(stream.kv_dtype))
        if stream.window_frames is not None and k.shape[2] > stream.window_frames:
            store = (store[0][:, :, -stream.window_frames:], store[1][:, :, -stream.window_frames:])
        stream.kv[key] = store
        past = k.shape[2] - t
        bias = attention_mask  # [b, t, t] additive chunk mask over the new frames
        if bias is not None:
            bias = F.pad(bias, (past, 0), value=0.0).view(b, 1, t, past + t)  # every earlier frame is visible
        return attend(attn, q, k, v, bias, hidden_states)


def _conv_pre(module: Any, args: tuple) -> tuple | None:
    stream = current_stream()
    if stream is None:
        return None
    import torch

    x = args[0]
    pad = module.causal_padding
    key = (stream.step, id(module))
    left = stream.conv.get(key)
    if left is None:
        left = x.new_zeros(x.shape[0], x.shape[1], pad)  # what the convolution's own padding would be
    x = torch.cat([left, x], dim=2)
    stream.conv[key] = x[:, :, -pad:]
    return (x,)


def _conv_post(module: Any, _args: tuple, out: Any) -> Any:
    return out if current_stream() is None else out[:, :, module.causal_padding:]


def install(flow: Any) -> None:
    """Make ``flow`` streamable incrementally (no-op behaviour while no FlowStream is bound)."""
    if not hook_estimator(flow.decoder.estimator, "_cosyserve_flow_cache", _conv_pre, _conv_post, CachedAttention):
        return
    original = flow.inference

    def inference(*args: Any, **kw: Any) -> Any:
        stream = current_stream()
        if stream is None:
            return original(*args, **kw)
        if not stream.recompute and stream.budget is not None and not stream.budget.admit_hop(flow, stream, kw):
            stream.drop_cache()
        if stream.recompute:
            with bound_stream(None):  # the estimator's hooks too: no cache from here on
                return original(*args, **kw)
        out = incremental_inference(flow, stream, **kw)
        if stream.budget is not None:
            stream.budget.settle(id(stream), stream.nbytes())
        return out

    inference.__wrapped__ = original  # type: ignore[attr-defined]
    flow.inference = inference


def incremental_inference(flow: Any, stream: FlowStream, *, token: Any, token_len: Any, prompt_token: Any,
                          prompt_token_len: Any, prompt_feat: Any, prompt_feat_len: Any, embedding: Any,
                          streaming: bool = True, finalize: bool = False, **_: Any) -> tuple[Any, None]:
    """``flow.inference`` for the frames after ``stream.frames_done`` (earlier mel frames are zeros)."""
    import torch
    import torch.nn.functional as F

    emb = flow.spk_embed_affine_layer(F.normalize(embedding, dim=1))
    tokens = torch.cat([prompt_token, token], dim=1)
    n = torch.tensor([tokens.shape[1]], dtype=torch.int32, device=tokens.device)
    x = flow.input_embedding(torch.clamp(tokens, min=0))
    if finalize:
        h, _ = flow.encoder(x, n, streaming=True)
    else:
        look = flow.pre_lookahead_len
        h, _ = flow.encoder(x[:, :-look], n, context=x[:, -look:], streaming=True)
    mu = flow.encoder_proj(h).transpose(1, 2)  # [1, 80, frames]
    total, prompt_frames = mu.shape[2], prompt_feat.shape[1]
    if stream.frames_done == 0 and stream.prompt_key is not None and stream.prompt_cache is not None:
        _start_after_prompt(flow, stream, prompt_token, prompt_feat, emb)
    start = stream.frames_done
    if start % flow.decoder.estimator.static_chunk_size:
        raise ValueError(f"a hop must start on a chunk boundary (frame {start})")
    cond = torch.zeros(1, flow.output_size, total, dtype=mu.dtype, device=mu.device)
    cond[:, :, :prompt_frames] = prompt_feat.transpose(1, 2)
    new_mel = _solve(flow.decoder, mu[:, :, start:], cond[:, :, start:], emb, start, stream)
    stream.frames_done = total
    stream.frames_computed += total - start
    if stream.first_call_frames is None:
        stream.first_call_frames = stream.frames_computed
    mel = torch.zeros(1, new_mel.shape[1], total - prompt_frames, dtype=new_mel.dtype, device=new_mel.device)
    mel[:, :, max(0, start - prompt_frames):] = new_mel[:, :, max(0, prompt_frames - start):]
    return mel.float(), None


def _start_after_prompt(flow: Any, stream: FlowStream, prompt_token: Any, prompt_feat: Any, emb: Any) -> None:
    """Load the voice's prompt state into ``stream`` (computing and storing it on a miss)."""
    assert stream.prompt_cache is not None and stream.prompt_key is not None
    state, computed = prompt_state(flow, stream.prompt_cache, stream.prompt_key, prompt_token, prompt_feat, emb,
                                   like=stream)
    if state is None:
        return
    if computed:
        stream.frames_computed += state.frames
    else:
        stream.prompt_frames_reused += state.frames
    # the stream's own dicts (its later entries replace, never modify, the shared tensors)
    stream.conv, stream.kv = dict(state.conv), dict(state.kv)
    stream.frames_done = state.frames


def prompt_state(flow: Any, cache: PromptCache, key: str, prompt_token: Any, prompt_feat: Any,
                 emb: Any, like: FlowStream | None = None) -> tuple[PromptState | None, bool]:
    """The voice's prompt state from ``cache`` (computed and stored on a miss; ``install`` must have run).

    ``emb`` is the projected speaker embedding ``[1, 80]``; ``like``: the stream that will use it (its
    key/value precision and runtime compute the state). Returns (state or None when the prompt has no
    cacheable frames, whether it was computed now).
    """
    import torch

    frames = cacheable_prompt_frames(flow, int(prompt_token.shape[1]))
    if frames <= 0:
        return None, False
    state = cache.get(key)
    if state is not None and state.frames == frames:
        return state, False
    # the voice alone: the encoder over the prompt tokens, the estimator over its cacheable frames
    n = torch.tensor([prompt_token.shape[1]], dtype=torch.int32, device=prompt_token.device)
    h, _ = flow.encoder(flow.input_embedding(torch.clamp(prompt_token, min=0)), n, streaming=True)
    mu = flow.encoder_proj(h).transpose(1, 2)[:, :, :frames]
    cond = prompt_feat[:, :frames].transpose(1, 2).to(mu.dtype)
    # unwindowed: the first hop then sees every prompt frame, as it does in one call without this cache
    fresh = FlowStream(kv_dtype=like.kv_dtype if like else None, runtime=like.runtime if like else None)
    with bound_stream(fresh):  # the estimator's hooks read the bound stream
        _solve(flow.decoder, mu, cond, emb, 0, fresh)
    # own copies where a cached tensor is a view pinning a larger input (so nbytes is what is held)
    conv = {k: _compact(v) for k, v in fresh.conv.items()}
    kv = {k: (_compact(kk), _compact(vv)) for k, (kk, vv) in fresh.kv.items()}
    fresh.conv, fresh.kv = conv, kv
    state = PromptState(frames=frames, conv=conv, kv=kv, nbytes=fresh.nbytes())
    cache.put(key, state)
    return state, True


def _compact(t: Any) -> Any:
    return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t


def _solve(cfm: Any, mu: Any, cond: Any, spks: Any, start: int, stream: FlowStream) -> Any:
    """CosyVoice's CFM Euler solve, over frames ``start:`` only, with the engine's steps and CFG
    (``engine.flow_steps`` / ``engine.flow_cfg``, read from ``flow_solver.options_of``)."""
    import torch

    options = options_of(cfm)
    rows = 2 if options.cfg else 1  # with CFG the second row is the unconditioned one
    t_len = mu.shape[2]
    x = cfm.rand_noise[:, :, start:start + t_len].to(mu.device).to(mu.dtype)
    t_span = time_grid(cfm, options.steps or MODEL_STEPS, mu.device, mu.dtype)
    rate = float(cfm.inference_cfg_rate)
    x_in = torch.zeros(rows, x.shape[1], t_len, dtype=x.dtype, device=x.device)
    mask_in = torch.ones(rows, 1, t_len, dtype=x.dtype, device=x.device)
    mu_in = torch.zeros_like(x_in)
    mu_in[0] = mu[0]
    spks_in = torch.zeros(rows, spks.shape[1], dtype=x.dtype, device=x.device)
    spks_in[0] = spks[0]
    cond_in = torch.zeros_like(x_in)
    cond_in[0] = cond[0]
    t, dt = t_span[0].reshape(1), t_span[1] - t_span[0]
    t_in = torch.zeros(rows, dtype=x.dtype, device=x.device)
    for i in range(1, len(t_span)):
        x_in[:] = x
        t_in[:] = t
        stream.step = i - 1
        if stream.runtime is not None:
            d = stream.runtime(x_in, mask_in, mu_in, t_in, spks_in, cond_in, stream)
        else:
            d = cfm.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=True)
        if options.cfg:
            d = (1.0 + rate) * d[:1] - rate * d[1:]
        x = x + dt * d
        t = t + dt
        if i < len(t_span) - 1:
            dt = t_span[i + 1] - t
    return x
