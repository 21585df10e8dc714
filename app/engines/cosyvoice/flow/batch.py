"""CosyVoice2/3's flow over several requests' calls at once: token encoder + CFM ODE, batched.

``flow.inference`` (``CausalMaskedDiffWithXvec`` in CosyVoice2, ``CausalMaskedDiffWithDiT``
in CosyVoice3) turns one request's prompt + speech tokens into mel frames: speaker
projection, the token encoder (v2: look-ahead layer + conformer + 2x upsampling +
conformer; v3: look-ahead layer + repeat), then a 10-step Euler ODE whose estimator
runs both classifier-free-guidance rows of the request together. This module does the
same for B calls in one pass, with our own code over the loaded modules:

* right padding to the longest call, a per-row length mask everywhere. Every layer the
  padding could reach is per-frame (norms, feed-forwards), causal (the estimator's and
  the upsampler's convolutions are left-padded) or attention, which the mask keeps off
  padded keys, so no request's frames change (``tests/integration/engines/cosyvoice/flow/test_batch.py``);
* the look-ahead: a streamed hop hands the encoder its last ``pre_lookahead_len`` tokens
  as *context*, appended after the hop's tokens. Here every row carries all its tokens and
  the look-ahead layer runs over them with zeros after each row's last token, which is
  what it computes for the context (and, for a final call, its own zero padding); the
  encoder then keeps each row's first tokens only;
* the ODE noise is CosyVoice's fixed buffer indexed by absolute frame, so every row
  reads the frames it reads alone;
* the CFG rows are interleaved (``2i``: conditioned, ``2i + 1``: unconditioned), 2B rows
  per estimator pass;
* streaming and non-streaming calls (chunk-masked vs full attention) run as two groups;
* a streamed call of a registered voice (``FlowItem.prompt``, with ``prompts`` on) starts
  after the voice's cached prompt frames (``flow/prefix.py``): its rows run the estimator
  over the rest only, each from its own start frame.

Between ODE steps, rows whose request was cancelled are dropped from the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ODE_STEPS = 10  # CosyVoice's flow.inference: n_timesteps=10


@dataclass
class FlowItem:
    """One ``flow.inference`` call, as CosyVoice's ``token2wav`` makes it (batch 1 tensors)."""

    token: Any  # [1, n] speech tokens of this call (its look-ahead included when not finalize)
    prompt_token: Any  # [1, p]
    prompt_feat: Any  # [1, pf, 80] prompt mel
    embedding: Any  # [1, 192] speaker embedding
    streaming: bool
    finalize: bool
    prompt: Any = None  # flow_prefix.PromptRef: a registered voice's cached prompt state (streamed calls)

    @classmethod
    def from_kwargs(cls, *, token: Any, prompt_token: Any, prompt_feat: Any, embedding: Any,
                    streaming: bool = False, finalize: bool = True, prompt: Any = None, **_: Any) -> FlowItem:
        return cls(token=token, prompt_token=prompt_token, prompt_feat=prompt_feat, embedding=embedding,
                   streaming=bool(streaming), finalize=bool(finalize), prompt=prompt)

    def encoder_tokens(self, lookahead: int) -> int:
        """Tokens the encoder keeps (prompt + this call's, less the look-ahead context)."""
        n = int(self.prompt_token.shape[1]) + int(self.token.shape[1])
        return n if self.finalize else n - lookahead


def unsupported_reason(flow: Any) -> str | None:
    """Why ``flow`` cannot be batched here, or None when it can (CosyVoice2/3's causal flows)."""
    import torch

    from app.engines.cosyvoice.flow import solver as flow_solver

    decoder = getattr(flow, "decoder", None)
    estimator = getattr(decoder, "estimator", None)
    if type(decoder).__name__ != "CausalConditionalCFM" or not hasattr(decoder, "rand_noise"):
        return "the flow is not CosyVoice2/3's causal flow matching (CausalConditionalCFM)"
    if not isinstance(estimator, torch.nn.Module):
        return "the flow estimator is not a torch module (a TensorRT engine runs one request at a time)"
    if type(estimator).__name__ not in ("CausalConditionalDecoder", "DiT"):
        return f"unknown flow estimator {type(estimator).__name__}"
    if not flow_solver.options_of(decoder).cfg:
        return "engine.flow_cfg is false (a batched round runs guided rows only)"
    if hasattr(flow, "encoder"):
        encoder = flow.encoder
        needed = ("embed", "pre_lookahead_layer", "forward_layers", "up_layer", "up_embed", "forward_up_layers")
        if not all(hasattr(encoder, name) for name in needed):
            return f"unknown flow encoder {type(encoder).__name__}"
    elif not hasattr(flow, "pre_lookahead_layer"):
        return "the flow has neither a token encoder nor a look-ahead layer"
    return None


def _dtype_of(module: Any) -> Any:
    return next(module.parameters()).dtype


class BatchedFlow:
    """``flow.inference`` for a list of calls, one padded pass per streaming kind."""

    def __init__(self, flow: Any, prompts: bool = False) -> None:
        """``prompts``: streamed calls with a ``FlowItem.prompt`` start after the voice's cached prompt
        frames (the flow must support the flow cache; ``flow_cache.install`` and ``flow_prefix.install``
        hook its estimator here)."""
        reason = unsupported_reason(flow)
        if reason is not None:
            raise TypeError(reason)
        self.flow = flow
        self.cfm = flow.decoder
        self.lookahead = int(flow.pre_lookahead_len)
        self.ratio = int(getattr(flow, "token_mel_ratio", 2))
        self.prompts = prompts
        if prompts:
            from app.engines.cosyvoice.flow import cache as flow_cache
            from app.engines.cosyvoice.flow import prefix as flow_prefix

            if not flow_cache.supports_flow_cache(flow):
                raise TypeError("this flow cannot start a call after cached prompt frames")
            flow_cache.install(flow)
            flow_prefix.install(flow)
        self.prompt_frames_reused = 0  # estimator frames taken from the prompt cache instead of computed

    def frames(self, item: FlowItem) -> int:
        """Estimator frames of ``item`` (prompt included): what it costs in a round."""
        return self.ratio * item.encoder_tokens(self.lookahead)

    def __call__(self, items: Sequence[FlowItem], alive: Callable[[int], bool] | None = None) -> list[Any]:
        """Each call's mel ``[1, 80, frames]`` (float32), as ``flow.inference`` returns it; None for
        a call whose ``alive(index)`` turned false while its round ran (its rows were dropped)."""
        out: list[Any] = [None] * len(items)
        for streaming in (True, False):
            group = [i for i, item in enumerate(items) if item.streaming == streaming]
            if not group:
                continue
            keep = None if alive is None else (lambda row, group=group: alive(group[row]))
            for row, mel in zip(group, self._run([items[i] for i in group], streaming, keep)):
                out[row] = mel
        return out

    # -- one group ----------------------------------------------------------------------------
    def _run(self, items: list[FlowItem], streaming: bool, alive: Callable[[int], bool] | None) -> list[Any]:
        import torch
        import torch.nn.functional as F

        flow = self.flow
        device = items[0].token.device
        emb = torch.cat([it.embedding.to(device) for it in items], dim=0)
        spks = flow.spk_embed_affine_layer(F.normalize(emb, dim=1))
        mu, frames = self._encode(items, streaming)
        prompt_frames = [int(it.prompt_feat.shape[1]) for it in items]
        cond = torch.zeros_like(mu)
        for i, it in enumerate(items):
            cond[i, :, :prompt_frames[i]] = it.prompt_feat[0].to(device).transpose(0, 1).to(mu.dtype)
        states = self._prompt_states(items, spks) if streaming and self.prompts else [None] * len(items)
        starts = [0 if st is None else int(st.frames) for st in states]
        mel = self._solve(mu, cond, spks, frames, streaming, alive, starts, states)
        out: list[Any] = []
        for i in range(len(items)):
            if mel[i] is None:
                out.append(None)
                continue
            if frames[i] < prompt_frames[i] or starts[i] > prompt_frames[i]:
                raise ValueError(f"the flow made {frames[i]} frames (from {starts[i]}) for a prompt of "
                                 f"{prompt_frames[i]}")
            out.append(mel[i][:, prompt_frames[i] - starts[i]:frames[i] - starts[i]].unsqueeze(0).float())
        return out

    def _prompt_states(self, items: list[FlowItem], spks: Any) -> list[Any]:
        """Each call's voice prompt state (computed and cached on the voice's first call), or None."""
        from app.engines.cosyvoice.flow.cache import prompt_state

        states: list[Any] = []
        for i, it in enumerate(items):
            state = None
            if it.prompt is not None:
                state, computed = prompt_state(self.flow, it.prompt.cache, it.prompt.key, it.prompt_token,
                                               it.prompt_feat, spks[i:i + 1])
                if state is not None and not computed:
                    self.prompt_frames_reused += int(state.frames)
            states.append(state)
        return states

    def _tokens(self, items: list[FlowItem]) -> tuple[Any, Any, Any]:
        """Prompt + call tokens right-padded ``[B, L]``, each row's token count, and its encoder length."""
        import torch

        device = items[0].token.device
        rows = [torch.cat([it.prompt_token.to(device), it.token.to(device)], dim=1)[0] for it in items]
        avail = torch.tensor([len(r) for r in rows], device=device)
        tokens = torch.zeros(len(rows), int(avail.max()), dtype=torch.long, device=device)
        for i, r in enumerate(rows):
            tokens[i, :len(r)] = r.long()
        lens = torch.tensor([it.encoder_tokens(self.lookahead) for it in items], device=device)
        if int(lens.min()) <= 0:
            raise ValueError("a flow call has no tokens to encode")
        return tokens, avail, lens

    def _encode(self, items: list[FlowItem], streaming: bool) -> tuple[Any, list[int]]:
        """The encoder's projected output ``mu`` ``[B, 80, F]`` and each row's frame count."""
        import torch

        flow = self.flow
        tokens, avail, lens = self._tokens(items)
        have = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < avail[:, None]  # [B, L]
        x = flow.input_embedding(torch.clamp(tokens, min=0)) * have.unsqueeze(-1)
        t_max = int(lens.max())
        if hasattr(flow, "encoder"):
            h, frame_lens = self._conformer(x, have, lens, t_max, streaming)
        else:  # CosyVoice3: look-ahead layer, then each token repeated token_mel_ratio times
            layer = flow.pre_lookahead_layer
            h = layer(x.to(_dtype_of(layer)))[:, :t_max].float()
            h = h.repeat_interleave(self.ratio, dim=1)
            frame_lens = lens * self.ratio
        mu = flow.encoder_proj(h).transpose(1, 2).contiguous() if hasattr(flow, "encoder_proj") else \
            h.transpose(1, 2).contiguous()
        return mu, [int(n) for n in frame_lens]

    def _conformer(self, x: Any, have: Any, lens: Any, t_max: int, streaming: bool) -> tuple[Any, Any]:
        """CosyVoice2's ``UpsampleConformerEncoder.forward`` over padded rows (see the module docstring)."""
        from cosyvoice.utils.mask import add_optional_chunk_mask, make_pad_mask

        enc = self.flow.encoder
        x = x.to(_dtype_of(enc))
        if getattr(enc, "global_cmvn", None) is not None:
            x = enc.global_cmvn(x)
        x, _, _ = enc.embed(x, have.unsqueeze(1))
        x = x * have.unsqueeze(-1).to(x.dtype)  # after each row's tokens: the look-ahead layer's zero padding
        x = enc.pre_lookahead_layer(x)[:, :t_max]
        pos_emb = enc.embed.position_encoding(offset=0, size=t_max)
        masks = ~make_pad_mask(lens, t_max).unsqueeze(1)
        chunk = int(enc.static_chunk_size) if streaming else 0
        x = enc.forward_layers(x, add_optional_chunk_mask(x, masks, False, False, 0, chunk, -1), pos_emb, masks)
        x, up_lens = enc.up_layer(x.transpose(1, 2).contiguous(), lens)
        x = x.transpose(1, 2).contiguous()
        masks = ~make_pad_mask(up_lens, x.size(1)).unsqueeze(1)
        x, pos_emb, masks = enc.up_embed(x, masks)
        up_chunk = chunk * int(enc.up_layer.stride)
        x = enc.forward_up_layers(x, add_optional_chunk_mask(x, masks, False, False, 0, up_chunk, -1), pos_emb, masks)
        if getattr(enc, "normalize_before", False):
            x = enc.after_norm(x)
        return x.float(), up_lens

    def _solve(self, mu: Any, cond: Any, spks: Any, frames: list[int], streaming: bool,
               alive: Callable[[int], bool] | None, starts: list[int] | None = None,
               states: list[Any] | None = None) -> list[Any]:
        """CosyVoice's CFM Euler solve with classifier-free guidance, for every row at once.

        Row ``i`` runs frames ``starts[i]:frames[i]`` (``states[i]``: the prefix before them).
        Returns each row's ``[80, F - start]`` estimate (None for a row dropped as cancelled).
        """
        import torch

        from app.engines.cosyvoice.flow import prefix as flow_prefix
        from app.engines.cosyvoice.flow import solver as flow_solver

        cfm = self.cfm
        b, channels, _ = mu.shape
        dtype, device = spks.dtype, mu.device
        starts = starts or [0] * b
        lengths_list = [f - s for f, s in zip(frames, starts)]
        f_max = max(lengths_list)
        if any(starts):  # each row from its own start frame
            mu, cond = self._from(mu, starts, f_max), self._from(cond, starts, f_max)
        else:
            mu, cond = mu[:, :, :f_max], cond[:, :, :f_max]
        noise = cfm.rand_noise
        if max(frames) > noise.shape[2]:
            raise ValueError(f"a flow call of {max(frames)} frames exceeds the model's noise buffer ({noise.shape[2]})")
        x = self._from(noise.expand(b, -1, -1), starts, f_max).to(device=device, dtype=dtype)
        lengths = torch.tensor(lengths_list, device=device)
        mask = (torch.arange(f_max, device=device)[None, :] < lengths[:, None]).unsqueeze(1).to(dtype)  # [B, 1, F]
        prefix = flow_prefix.PrefixRows(list(states)) if states is not None and any(states) else None
        steps = flow_solver.options_of(cfm).steps or ODE_STEPS  # engine.flow_steps, as the per-request path
        t_span = flow_solver.time_grid(cfm, steps, device, mu.dtype)
        rate = float(cfm.inference_cfg_rate)
        rows = list(range(b))  # which item each batch row is
        x_in = torch.zeros(2 * b, channels, f_max, device=device, dtype=dtype)
        mask_in = mask.repeat_interleave(2, dim=0)
        mu_in = torch.zeros_like(x_in)
        mu_in[0::2] = mu
        spks_in = torch.zeros(2 * b, spks.shape[1], device=device, dtype=dtype)
        spks_in[0::2] = spks
        cond_in = torch.zeros_like(x_in)
        cond_in[0::2] = cond
        t_in = torch.zeros(2 * b, device=device, dtype=dtype)
        t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            x_in[0::2] = x
            x_in[1::2] = x
            t_in[:] = t
            if prefix is not None:
                prefix.step = step - 1
            with flow_prefix.bound(prefix):
                d = cfm.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming)
            d = (1.0 + rate) * d[0::2] - rate * d[1::2]
            x = x + dt * (d * mask)  # padded frames stay noise (finite): they feed masked keys only
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
                if alive is not None:
                    keep = [r for r, item in enumerate(rows) if alive(item)]
                    if len(keep) < len(rows):
                        if not keep:
                            return [None] * b
                        idx = torch.tensor(keep, device=device)
                        pair = torch.stack([2 * idx, 2 * idx + 1], dim=1).reshape(-1)
                        x, mask, rows = x[idx], mask[idx], [rows[r] for r in keep]
                        if prefix is not None:
                            prefix.keep(keep)
                        x_in, mask_in, mu_in, spks_in, cond_in = (x_in[pair], mask_in[pair], mu_in[pair],
                                                                  spks_in[pair], cond_in[pair])
                        t_in = t_in[:len(pair)]
        out: list[Any] = [None] * b
        for r, item in enumerate(rows):
            out[item] = x[r].float()
        return out

    @staticmethod
    def _from(t: Any, starts: list[int], length: int) -> Any:
        """``t[i, :, starts[i]:]`` for each row, right-padded with zeros to ``length`` frames."""
        out = t.new_zeros(t.shape[0], t.shape[1], length)
        for i, s in enumerate(starts):
            piece = t[i, :, s:s + length]
            out[i, :, :piece.shape[1]] = piece
        return out
