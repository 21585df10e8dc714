"""Stop control for the tiny random-weight CosyVoice LLMs (used by ``tiny.py``).

Random weights never emit end-of-speech, so the LLM would always run to its
20x-text-tokens cap. The builder therefore wires a small, exact "stop controller"
into the random LLM (see ``StopPlan``):

* an attention head whose query is zero attends uniformly to the whole context and
  averages a marker that only prefix positions (sos, speaker, text) carry, so it
  reads ``~ 8 * P / n`` (P prefix positions, n context length);
* two feed-forward units turn that reading into a clamped ramp ``g`` in [0, 1]
  that opens when ``n / P`` passes a threshold;
* the output head's end-of-speech row reads ``g`` (``long=True``) or is a constant
  bias (``long=False``: stop right after the 2x-text minimum).

A large constant vector written by the same head keeps the normalisation layers'
scale fixed, so the readings are nearly exact. For v2 a second reading (is the
task-id token in context?) suppresses Qwen2LM's "fill" token outside bistream
text input, where upstream would raise on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.devmodels.configs import LLM_DIM, LLM_HEADS

# Residual-stream dimensions reserved by the stop controller (LLM width 64, 2 heads of 32).
_S_MARK, _S_TASK, _R_COUNT, _R_TASK, _R_GATE, _T_ONE = 0, 1, 2, 3, 4, 5
_RESERVED = (_S_MARK, _S_TASK, _R_COUNT, _R_TASK, _R_GATE, _T_ONE)
_HEAD = slice(LLM_DIM // LLM_HEADS, LLM_DIM)  # the counting head (query == 0)
_V_COUNT, _V_TASK, _V_ONE = _HEAD.start, _HEAD.start + 1, _HEAD.start + 2
_Q1, _Q2 = 0, 1  # feed-forward units forming the ramp


@dataclass
class StopPlan:
    long: bool
    gen: Any
    b_rms: float = 100.0  # size of the constant vector that pins the norms' scale
    marker: float = 8.0  # what a normalisation layer makes of a dominating marker (sqrt(64))
    stop_ratio: float = 15.0  # long: the ramp opens when context length / prefix length passes this
    sharpness: float = 4000.0  # ramp slope in units of the counter reading
    ramp: float = 20.0  # ramp width (pre-activation units)
    low: float = 30.0  # long: EOS logit before the ramp opens is -low
    eos_long: float = 4.0  # EOS logit once open (p ~ 0.7 per step inside the top-25 nucleus)
    eos_short: float = 3.0  # short: constant EOS logit (stops ~1-2 tokens after the 2x minimum)
    head_std: float = 0.05

    def _const_vector(self, extra_one: bool) -> Any:
        import torch

        b = torch.randn(LLM_DIM, generator=self.gen)
        b[list(_RESERVED)] = 0.0
        free = [i for i in range(LLM_DIM) if i not in _RESERVED]
        b[free] -= b[free].mean()
        b *= self.b_rms * (LLM_DIM - 1) ** 0.5 / b.norm()
        if extra_one:
            b[_T_ONE] = self.b_rms
        return b

    def _decoder(self, lin: Any, n_speech: int, b: Any, fill: int | None) -> None:
        """Speech rows random; row ``n_speech`` (the EOS CosyVoice masks before min_len) stops; other extras never.

        A decoder without a bias (CosyVoice3's) gets its biases from the ``_T_ONE`` input,
        which the normalised constant vector holds at ~1.
        """
        import torch

        w = torch.randn(lin.weight.shape, generator=self.gen) * self.head_std
        u = b / b.norm()
        w -= torch.outer(w @ u, u)  # speech logits ignore the constant direction
        w[:, list(_RESERVED)] = 0.0
        bias = torch.zeros(lin.weight.shape[0])
        w[n_speech:] = 0.0
        if self.long:
            w[n_speech, _R_GATE] = self.low + self.eos_long
            bias[n_speech] = -self.low
        else:
            bias[n_speech] = self.eos_short
        for extra in range(n_speech + 1, lin.weight.shape[0]):
            bias[extra] = -100.0
        if fill is not None:  # bistream text input needs the fill token until the task id is in context
            w[fill, _R_TASK] = -2.0e4
            bias[fill] = 0.5
        if lin.bias is None:
            if b[_T_ONE] == 0:
                raise ValueError("a decoder without bias needs the constant vector's _T_ONE entry")
            w[:, _T_ONE] = bias
            lin.weight.copy_(w)
            return
        lin.weight.copy_(w)
        lin.bias.copy_(bias)

    def _ramp_threshold(self) -> float:
        return self.marker / self.stop_ratio

    def install_v1(self, llm: Any) -> None:
        import torch

        enc = llm.llm
        j_in, m_in = 0, 10.0
        with torch.no_grad():
            for emb in (llm.llm_embedding.weight,):
                emb[:, j_in] = m_in
            llm.speech_embedding.weight[:, j_in] = 0.0
            for aff in (llm.spk_embed_affine_layer, llm.text_encoder_affine_layer):
                aff.weight[j_in] = 0.0
                aff.bias[j_in] = m_in
            # input projection: zero-mean outputs, marker only in _S_MARK, reserved dims silent
            lin = enc.embed.out[0]
            w, bias = lin.weight, lin.bias
            w[:, j_in] = 0.0
            w[list(_RESERVED)] = 0.0
            bias[list(_RESERVED)] = 0.0
            free = [i for i in range(LLM_DIM) if i not in _RESERVED]
            w[free] -= w[free].mean(dim=0, keepdim=True)
            bias[free] -= bias[free].mean()
            w[_S_MARK, j_in] = 10.0
            w[free, j_in] = -10.0 / len(free)
            b = self._const_vector(extra_one=False)
            for li, layer in enumerate(enc.encoders):
                att, ff = layer.self_attn, layer.feed_forward
                att.linear_out.weight[list(_RESERVED)] = 0.0
                att.linear_out.bias.copy_(b if li == 0 else torch.zeros_like(b))
                ff.w_2.weight[list(_RESERVED)] = 0.0
                ff.w_2.bias[list(_RESERVED)] = 0.0
                if li:
                    continue
                att.linear_q.weight[_HEAD] = 0.0
                att.linear_q.bias[_HEAD] = 0.0
                att.pos_bias_u[1] = 0.0
                att.pos_bias_v[1] = 0.0
                att.linear_v.weight[_HEAD] = 0.0
                att.linear_v.bias[_HEAD] = 0.0
                att.linear_v.weight[_V_COUNT, _S_MARK] = 1.0
                att.linear_out.weight[:, _HEAD] = 0.0
                att.linear_out.weight[_R_COUNT, _V_COUNT] = self.b_rms
                k, c = self.sharpness, self._ramp_threshold()
                for unit, shift in ((_Q1, 0.0), (_Q2, self.ramp)):
                    ff.w_1.weight[unit] = 0.0
                    ff.w_1.weight[unit, _R_COUNT] = -k
                    ff.w_1.bias[unit] = k * c - shift
                    ff.w_2.weight[:, unit] = 0.0
                ff.w_2.weight[_R_GATE, _Q1] = self.b_rms / self.ramp
                ff.w_2.weight[_R_GATE, _Q2] = -self.b_rms / self.ramp
            self._decoder(llm.llm_decoder, llm.speech_token_size, b, fill=None)

    def install_v2(self, llm: Any) -> None:
        """Qwen2LM: start and task markers are rows of ``llm_embedding``; bistream's fill token is suppressed."""
        self._install_qwen(llm, llm.llm_embedding.weight, llm.sos_eos, llm.task_id, fill=llm.speech_token_size + 2)

    def install_v3(self, llm: Any) -> None:
        """CosyVoice3LM: start and task markers are speech-embedding rows; the decoder has no bias.

        Its 200 stop ids all end the sequence, but only the first is masked before the
        2x minimum, so every other one gets a large negative logit. No fill token is needed
        outside bistream input (v3's fill id is one of the stop ids).
        """
        self._install_qwen(llm, llm.speech_embedding.weight, llm.sos, llm.task_id, fill=None)

    def _install_qwen(self, llm: Any, markers: Any, sos: int, task: int, fill: int | None) -> None:
        """The controller in a Qwen2-backed LLM (v2 and v3).

        Text tokens and the start row ``sos`` of ``markers`` (the embedding table holding the
        start and task rows) mark the prefix; the task row carries its own marker; the
        reserved dims of every other embedding row stay silent.
        """
        import torch

        qwen = llm.llm.model.model
        m_in = 40.0
        with torch.no_grad():
            for table in (qwen.embed_tokens.weight, markers, llm.speech_embedding.weight):
                table[:, list(_RESERVED)] = 0.0
            qwen.embed_tokens.weight[:, _S_MARK] = m_in
            markers[sos, _S_MARK] = m_in
            markers[task, _S_TASK] = m_in
            b = self._const_vector(extra_one=True)
            self._qwen_layers(qwen, b)
            self._decoder(llm.llm_decoder, llm.speech_token_size, b, fill=fill)

    def _qwen_layers(self, qwen: Any, b: Any) -> None:
        """The counting head and the ramp in the first Qwen2 layer; reserved dims silent elsewhere."""
        import torch

        with torch.no_grad():
            for li, layer in enumerate(qwen.layers):
                att, mlp = layer.self_attn, layer.mlp
                att.o_proj.weight[list(_RESERVED)] = 0.0
                mlp.down_proj.weight[list(_RESERVED)] = 0.0
                if li:
                    continue
                att.q_proj.weight[_HEAD] = 0.0
                att.q_proj.bias[_HEAD] = 0.0
                att.v_proj.weight[_HEAD] = 0.0
                att.v_proj.bias[_HEAD] = 0.0
                att.v_proj.weight[_V_COUNT, _S_MARK] = 1.0
                att.v_proj.weight[_V_TASK, _S_TASK] = 1.0
                att.v_proj.bias[_V_ONE] = 1.0
                att.o_proj.weight[:, _HEAD] = 0.0
                att.o_proj.weight[_R_COUNT, _V_COUNT] = self.b_rms
                att.o_proj.weight[_R_TASK, _V_TASK] = self.b_rms
                att.o_proj.weight[:, _V_ONE] = b
                k, c = self.sharpness, self._ramp_threshold()
                for unit, shift in ((_Q1, 0.0), (_Q2, self.ramp)):
                    mlp.gate_proj.weight[unit] = 0.0
                    mlp.gate_proj.weight[unit, _R_COUNT] = -k
                    mlp.gate_proj.weight[unit, _T_ONE] = k * c - shift
                    mlp.up_proj.weight[unit] = 0.0
                    mlp.up_proj.weight[unit, _T_ONE] = 1.0
                    mlp.down_proj.weight[:, unit] = 0.0
                mlp.down_proj.weight[_R_GATE, _Q1] = self.b_rms / self.ramp
                mlp.down_proj.weight[_R_GATE, _Q2] = -self.b_rms / self.ramp
