"""The target's forward for decoding: a static KV cache, few operators (gpt-fast style). Decoding
runs it at batch 1; capture's answers (eyas.data.answers) over a left-padded batch.

Why not transformers' forward: at batch 1 on a CPU a decode step is a few dozen small matrix
products, and transformers adds work that does not shrink with them: a DynamicCache that copies
every layer's keys each step, masks and kwargs rebuilt per call, three q/k/v products and two
gate/up products where one each would do, logits for every prompt position at prefill, and bf16
attention kernels that are slow for a handful of queries. This forward runs the same arithmetic
with less of that: q/k/v and gate/up are one product each, over weights packed for oneDNN
(eyas.decode.packed: a second copy of the layer weights, the price of about twice the speed), the
residual adds fused into the products before them, keys and values written in place into a
`StaticKV` with attention in fp32 over it, logits only for the rows asked for, and the captured
layers recorded on the way (no hooks).

It implements the Llama family (Llama, Mistral without a sliding window, Qwen2, Qwen3: pre-norm
RMSNorm decoders with rotary attention and a gated SiLU MLP); `lean_target` returns None for any
other target, which then decodes through transformers (eyas.decode.verify). Rotary cos/sin come
from the model's own rotary module, so every rope scaling transformers implements is honoured.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eyas.decode.packed import PackedLinear
from eyas.decode.static_cache import StaticKV
from eyas.target import Target, TargetOutput

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # decoders this forward reproduces exactly


@dataclass
class _Norm:
    weight: Tensor
    eps: float

    def __call__(self, x: Tensor) -> Tensor:
        """transformers' LlamaRMSNorm as one fused operator: the same result in fp32; in bf16 the
        weight multiplies before the one rounding instead of after a first one."""
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


@dataclass
class _Layer:
    in_norm: _Norm
    qkv: PackedLinear  # q_proj, k_proj, v_proj as one product
    q_norm: _Norm | None  # qwen3: RMSNorm over head_dim on every q and k head, before rope
    k_norm: _Norm | None
    o: PackedLinear
    post_norm: _Norm
    gate_up: PackedLinear  # gate_proj, up_proj as one product
    down: PackedLinear


def _norm(module: nn.Module) -> _Norm:
    return _Norm(module.weight, float(module.variance_epsilon))


def unsupported(target: Target) -> str | None:
    """Why the lean forward cannot run `target` (None: it can)."""
    c = target.config
    if c.model_type not in MODEL_TYPES:
        return f"model type {c.model_type!r} is none of {', '.join(MODEL_TYPES)}"
    if c.hidden_act != "silu":
        return f"hidden_act {c.hidden_act!r}"
    if getattr(c, "sliding_window", None) is not None and c.model_type == "mistral":
        return "a sliding attention window"
    if any(t != "full_attention" for t in getattr(c, "layer_types", None) or ()):
        return "sliding-window layers"
    if not hasattr(target.decoder, "rotary_emb"):
        return "no shared rotary embedding module"
    if len({p.device for p in target.model.parameters()}) > 1:
        return "weights spread over several devices (transformers' forward moves the states between them)"
    return None


def _weights_id(target: Target) -> tuple:
    """What the packed copy was made from: the model's weight tensors, unmodified (`.to(dtype)`
    replaces them, `load_state_dict` writes into them and bumps their `_version`)."""
    return tuple((p.data_ptr(), p.dtype, p._version) for p in target.model.parameters())


class LeanTarget:
    """The decode-time forward of one loaded target (built by `lean_target`)."""

    def __init__(self, target: Target):
        self.weights_id = _weights_id(target)
        decoder = target.decoder
        self.embed = decoder.embed_tokens
        self.rotary = decoder.rotary_emb
        self.norm = _norm(decoder.norm)
        self.lm_head = PackedLinear([target.model.get_output_embeddings()])
        self.logit_map = target.logit_map
        first = decoder.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = target.config.num_attention_heads
        self.kv_heads = target.config.num_key_value_heads
        self.scale = float(first.scaling)
        self.device = decoder.embed_tokens.weight.device
        self.layers = [self._layer(layer) for layer in decoder.layers]

    @staticmethod
    def _layer(layer: nn.Module) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        qk = (_norm(a.q_norm), _norm(a.k_norm)) if hasattr(a, "q_norm") else (None, None)
        return _Layer(_norm(layer.input_layernorm), PackedLinear([a.q_proj, a.k_proj, a.v_proj]), *qk,
                      PackedLinear([a.o_proj]), _norm(layer.post_attention_layernorm),
                      PackedLinear([m.gate_proj, m.up_proj]), PackedLinear([m.down_proj]))

    def new_cache(self, max_len: int, *, batch: int = 1, dtype: torch.dtype = torch.float32) -> StaticKV:
        return StaticKV(len(self.layers), self.kv_heads, self.head_dim, max_len, self.device, batch=batch, dtype=dtype)

    @torch.no_grad()
    def forward(
        self, input_ids: Tensor, position_ids: Tensor, cache: StaticKV, capture: Sequence[int], *,
        mask: Tensor | None = None, logit_rows: slice | None = None,
    ) -> TargetOutput:
        """input_ids / position_ids [B, T] after the cache's valid positions; the cache advances by T.

        mask: bool [T, length + T] or, per row, [B, T, length + T] (True = may attend: a tree's
        ancestor mask, a left-padded batch's), None = causal. Features [B, T, A*H] at `capture`
        (indices as in Target.forward); logits [B, R, V] for the rows `logit_rows` selects (None:
        all). `past_key_values` of the result is the cache.
        """
        B, T, past = *input_ids.shape, cache.length
        h = self.embed(input_ids)  # [B, T, H]
        cos, sin = self.rotary(h, position_ids)  # [B, T, D] each, in the weights' dtype
        cos, sin = cos[:, :, None], sin[:, :, None]  # [B, T, 1, D]: the same rotation for every head
        attn_mask = None
        if mask is not None:
            attn_mask = mask[None, None] if mask.dim() == 2 else mask[:, None]
        elif T > 1 and past > 0:
            keys = torch.arange(past + T, device=h.device)
            attn_mask = (keys[None, :] <= past + torch.arange(T, device=h.device)[:, None])[None, None]
        wanted = set(capture)
        captured: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in wanted:
                captured[i] = h
            h = self._layer_forward(i, layer, h, cos, sin, cache, attn_mask)
        if len(self.layers) in wanted:
            captured[len(self.layers)] = h
        cache.length += T
        last = self.norm(h)
        rows = last if logit_rows is None else last[:, logit_rows]
        features = torch.cat([captured[k] for k in capture], dim=-1) if capture else h.new_empty(B, T, 0)
        return TargetOutput(features, last, self.logit_map(self.lm_head(rows)), cache)

    def _layer_forward(self, i: int, layer: _Layer, h: Tensor, cos: Tensor, sin: Tensor, cache: StaticKV,
                       attn_mask: Tensor | None) -> Tensor:
        (B, T, _), D, nh, nkv = h.shape, self.head_dim, self.heads, self.kv_heads
        qkv = layer.qkv(layer.in_norm(h)).view(B, T, nh + 2 * nkv, D)  # [B, T, heads, D]
        qk, v = qkv[:, :, : nh + nkv], qkv[:, :, nh + nkv :]
        if layer.q_norm is not None:
            qk = torch.cat([layer.q_norm(qk[:, :, :nh]), layer.k_norm(qk[:, :, nh:])], dim=2)
        x1, x2 = qk.chunk(2, dim=-1)  # q and k rotated together (transformers' halves layout)
        q, k = (qk * cos + torch.cat([-x2, x1], dim=-1) * sin).split([nh, nkv], dim=2)
        keys, values = cache.update(i, k.transpose(1, 2), v.transpose(1, 2))  # [B, n_kv, length + T, D]
        y = F.scaled_dot_product_attention(q.transpose(1, 2).to(keys.dtype), keys, values, attn_mask=attn_mask,
                                           scale=self.scale, is_causal=attn_mask is None and T > 1,
                                           enable_gqa=nkv != nh)
        h = layer.o(y.to(h.dtype).transpose(1, 2).reshape(B, T, nh * D), add=h)
        gate, up = layer.gate_up(layer.post_norm(h)).chunk(2, dim=-1)
        return layer.down(F.silu(gate) * up, add=h)


_BUILT: weakref.WeakKeyDictionary[Target, LeanTarget] = weakref.WeakKeyDictionary()


def built(target: Target) -> bool:
    """Whether `target`'s lean forward exists already, made from its current weights."""
    lean = _BUILT.get(target)
    return lean is not None and lean.weights_id == _weights_id(target)


def lean_target(target: Target) -> LeanTarget | None:
    """The lean forward of `target` (built once per loaded target), or None when it is unsupported."""
    if unsupported(target) is not None:
        return None
    if not built(target):
        _BUILT[target] = LeanTarget(target)
    return _BUILT[target]
