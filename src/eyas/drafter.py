"""The EAGLE-3 draft model in plain PyTorch: one model, one file, checkpoint names as module names.

A `Drafter` is built from a `DraftContract`. Its module names are the canonical (speculators) tensor
names, so `state_dict()` is the checkpoint as it stands: `fc`, `layers.0.hidden_norm`, `norm`,
`lm_head`, `d2t`, ... Loading is `load_state_dict`, no rename table.

One draft step, in the order the code runs it (references: speculators `models/eagle3/core.py`,
EAGLE `cnets.py`):

    h   = fc(feature_norm(g))         # [B, T, A*H_t] -> [B, T, H]: `combine`, first step only
    e   = embed_tokens(x)             # x_{t+1}: the token AFTER the one whose features are g_t
    layer 0:  e', h' = input_layernorm(e), hidden_norm(h)
              residual = h' if norm_before_residual else h
              h1  = residual + o_proj(attn(cat(e', h')))    # [B, T, 2H]: embedding FIRST
              out = h1 + mlp(post_attention_layernorm(h1))
    layers 1..: standard pre-norm decoder layers over H
    logits      = lm_head(norm(out))  # over the draft vocab; target id = i + d2t[i]
    next hidden = norm(out) if norm_output else out

`forward` runs one step over T new positions, with an optional `DraftCache` and boolean mask (chains
and trees for decoding); `forward_ttt` is the training-time-test unroll built from `forward` (its
attention: `eyas.ttt_attention`).
Around the model: `eyas.rope` (rotary frequencies), `eyas.drafter_checks` (what a drafter can be
built from), `eyas.drafter_loading` (a drafter from a checkpoint folder, the shipped draft).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eyas.activations import ACTIVATIONS
from eyas.borrowed import SharedEmbedding, SharedHead
from eyas.contract import DraftContract
from eyas.drafter_checks import check_buildable, check_runnable, check_tensors, check_vocab_map
from eyas.errors import ContractError
from eyas.rope import rope_parameters
from eyas.shift import shift_left
from eyas.ttt_attention import TTTCache, in_window

# --- attention: SDPA for speed, the eager formula as its reference (tested against each other) ---


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """GQA: [B, n_kv, S, D] -> [B, n_kv * n_rep, S, D], i.e. `repeat_interleave(x, n_rep, dim=1)`."""
    B, n_kv, S, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None].expand(B, n_kv, n_rep, S, D).reshape(B, n_kv * n_rep, S, D)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """q [B, nh, T, D], k/v [B, n_kv, S, D], mask bool [B or 1, T, S] (True = may attend) -> [B, nh, T, D]."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])


def eager_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """The reference for `sdpa_attention`: softmax(q k^T / sqrt(D) + mask) v, softmax in fp32."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, nh, T, S]
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


ATTENTION: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]] = {
    "sdpa": sdpa_attention,
    "eager": eager_attention,
}


def _check_implemented(c: DraftContract, attention: str) -> None:
    """The contract asks for what this model implements (rope types are checked in eyas.rope)."""
    assert attention in ATTENTION, f"attention must be one of {sorted(ATTENTION)}"
    if c.hidden_act not in ACTIVATIONS:
        raise ContractError(
            f"hidden_act {c.hidden_act!r} is not supported by the eyas drafter",
            f"supported: {', '.join(ACTIVATIONS)}",
        )


# --- rotary position embedding (frequencies: eyas.rope) ---


def rotate_half(x: Tensor) -> Tensor:
    """[x1, x2] -> [-x2, x1] over the last dim (the HF/Llama rope layout: halves, not pairs)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


# --- the layers ---


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Computed in fp32 and cast back (as HF LlamaRMSNorm): in fp16 the mean of squares overflows
        # at |x| ~ 256, and in bf16 it loses precision. The weight multiplies after the cast.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, c: DraftContract, layer_idx: int, in_features: int, attention: str):
        super().__init__()
        self.layer_idx, self.head_dim = layer_idx, c.head_dim
        q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = nn.Linear(in_features, q_out, bias=c.attention_bias)
        self.k_proj = nn.Linear(in_features, kv_out, bias=c.attention_bias)
        self.v_proj = nn.Linear(in_features, kv_out, bias=c.attention_bias)
        self.o_proj = nn.Linear(q_out, c.hidden_size, bias=c.attention_bias)
        self.qk_norm = c.layer_type == "qwen3"
        if self.qk_norm:  # qwen3: RMSNorm over head_dim on every q and k head, before rope
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.attention = ATTENTION[attention]

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor,
                cache: DraftCache | TTTCache | None) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim)  # [B, T, nh, D]
        k = self.k_proj(x).view(B, T, -1, self.head_dim)  # [B, T, n_kv, D]
        v = self.v_proj(x).view(B, T, -1, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, D]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]: same rotation for every head
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if isinstance(cache, TTTCache):  # training-time test: step-0 keys (its own mask) + t's own diagonal
            y = cache.attend(self.layer_idx, q, k, v)
        else:
            if cache is not None:
                k, v = cache.update(self.layer_idx, k, v)  # [B, n_kv, cache_len + T, D]
            # decoding's cache (eyas.decode.StaticKV) keeps k/v in fp32: attention then runs in fp32
            y = self.attention(q.to(k.dtype), k, v, mask).to(x.dtype)  # [B, nh, T, D]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, c: DraftContract):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Layer 0 is the EAGLE-3 layer (attention over cat(embedding, hidden), 2H wide, plus
    `hidden_norm`); later layers are plain pre-norm Llama/Qwen3 decoder layers over H."""

    def __init__(self, c: DraftContract, layer_idx: int, attention: str):
        super().__init__()
        self.first = layer_idx == 0
        H = c.hidden_size
        self.self_attn = Attention(c, layer_idx, 2 * H if self.first else H, attention)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(H, c.rms_norm_eps)
        if self.first:
            self.hidden_norm = RMSNorm(H, c.rms_norm_eps)
            self.norm_before_residual = c.norm_before_residual
        self.post_attention_layernorm = RMSNorm(H, c.rms_norm_eps)

    def forward(
        self,
        hidden: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        cache: DraftCache | None,
        embeds: Tensor | None = None,
    ) -> Tensor:
        if self.first:
            assert embeds is not None, "layer 0 reads the token embeddings"
            e, h = self.input_layernorm(embeds), self.hidden_norm(hidden)
            # norm_before_residual: the residual stream carries hidden_norm(h), else the raw h
            residual = h if self.norm_before_residual else hidden
            x = torch.cat([e, h], dim=-1)  # [B, T, 2H], embedding first
        else:
            residual, x = hidden, self.input_layernorm(hidden)
        hidden = residual + self.self_attn(x, cos, sin, mask, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


# --- masks ---


def causal_mask(T: int, past: int, device: torch.device, window: int | None = None) -> Tensor:
    """[1, T, past + T] bool: new position i sees the whole cache and new positions <= i (with a
    sliding `window`, only the last `window` of them, itself included)."""
    keys = torch.arange(past + T, device=device)
    queries = past + torch.arange(T, device=device)
    return (keys[None, :] <= queries[:, None])[None] & in_window(queries, keys, window)


def ttt_mask(T: int, steps: int, document_ids: Tensor | None, device: torch.device) -> Tensor:
    """[B or 1, T, steps * T] bool for the TTT unroll; step j uses the first (j + 1) * T columns.

    Keys are laid out step by step (step 0's T positions, then step 1's, ...). Block 0 is causal
    (and block-diagonal per document); block s >= 1 is the identity: position t sees only its own
    step-s entry, because step s at t drafted a token that only the chain at t contains.
    """
    pos = torch.arange(T, device=device)
    step0 = (pos[None, :] <= pos[:, None])[None]  # [1, T, T]
    if document_ids is not None:
        step0 = step0 & (document_ids[:, :, None] == document_ids[:, None, :])  # [B, T, T]
    own = torch.eye(T, dtype=torch.bool, device=device).expand_as(step0)
    return torch.cat([step0] + [own] * (steps - 1), dim=-1)


# --- the cache ---


class DraftCache:
    """Rotated keys and values of every position the draft has processed, per layer.

    Grows by concatenation rather than writing into a preallocated buffer: gradients flow through
    it, and autograd rejects in-place writes into a buffer whose earlier slices it saved. Decoding
    needs no gradients and uses eyas.decode.StaticKV instead (same interface, preallocated).
    `max_len` (optional) bounds the length; exceeding it is a caller bug.
    """

    def __init__(self, drafter: Drafter, batch_size: int, max_len: int | None = None):
        c = drafter.contract
        p = drafter.norm.weight
        empty = p.new_zeros(batch_size, c.num_key_value_heads, 0, c.head_dim)
        self.k = [empty] * c.num_hidden_layers
        self.v = [empty] * c.num_hidden_layers
        self.length = 0  # positions stored; Drafter.forward advances it after all layers appended
        self.max_len = max_len

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append k/v [B, n_kv, T, D] to layer `layer_idx`; return all of them [B, n_kv, length + T, D]."""
        if self.max_len is not None and self.length + k.shape[2] > self.max_len:
            raise ValueError(
                f"DraftCache holds at most {self.max_len} positions; {self.length} + {k.shape[2]} requested"
            )
        self.k[layer_idx] = torch.cat([self.k[layer_idx], k], dim=2)
        self.v[layer_idx] = torch.cat([self.v[layer_idx], v], dim=2)
        return self.k[layer_idx], self.v[layer_idx]

    def crop(self, length: int) -> None:
        """Forget every position past `length` (e.g. rejected draft tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a DraftCache of length {self.length} to {length}")
        self.k = [k[:, :, :length] for k in self.k]
        self.v = [v[:, :, :length] for v in self.v]
        self.length = length


# --- the model ---


class Drafter(nn.Module):
    """An EAGLE-3 draft model; `state_dict()` keys are exactly `expected_shapes(contract)`."""

    def __init__(self, contract: DraftContract, *, embed_tokens: Tensor | None = None, lm_head: Tensor | None = None,
                 attention: str = "sdpa"):
        super().__init__()
        c = self.contract = contract
        _check_implemented(c, attention)
        check_buildable(c, embed_tokens, lm_head)
        H, A, H_t = c.hidden_size, c.num_aux_layers, c.target_hidden_size
        if c.has_embeddings:
            self.embed_tokens = nn.Embedding(c.vocab_size, H)
        else:
            self.embed_tokens = SharedEmbedding(embed_tokens)
        if c.norm_before_fc:  # one norm over the concatenated features (gpt-oss style)
            self.input_norm = RMSNorm(A * H_t, c.rms_norm_eps)
        if c.fc_norm:  # one norm per captured layer (EAGLE-3.1)
            self.fc_norm = nn.ModuleList(RMSNorm(H_t, c.rms_norm_eps) for _ in range(A))
        self.fc = nn.Linear(A * H_t, H, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(c, i, attention) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False) if c.has_lm_head else SharedHead(lm_head)
        if c.has_vocab_map:
            # d2t is an offset: target_id = draft_id + d2t[draft_id]; t2d marks the target ids drafted
            self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
            self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        # A plain attribute, not a buffer: `.to(bfloat16)` would round the frequencies. No position
        # table either: cos/sin come from position_ids, so no max_position_embeddings cap.
        self.inv_freq, self.rope_scale = rope_parameters(c)

    @classmethod
    def from_tensors(
        cls,
        contract: DraftContract,
        tensors: dict[str, Tensor],
        *,
        embed_tokens: Tensor | None = None,
        lm_head: Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        attention: str = "sdpa",
    ) -> Drafter:
        """A drafter holding copies of `tensors` (canonical names), floats cast to `dtype`; the
        target's `embed_tokens` and `lm_head` where the contract borrows them (eyas.borrowed)."""
        check_runnable(contract)  # every run verb comes through here: a draft eyas cannot run stops first
        check_tensors(contract, tensors)
        if contract.has_vocab_map:
            check_vocab_map(contract, tensors["d2t"], tensors["t2d"])
        embed_tokens, lm_head = (None if t is None else t.to(dtype) for t in (embed_tokens, lm_head))
        with torch.device("meta"):  # no random init of weights about to be replaced
            drafter = cls(contract, embed_tokens=embed_tokens, lm_head=lm_head, attention=attention)
        state = {k: v.to(dtype if v.is_floating_point() else v.dtype, copy=True) for k, v in tensors.items()}
        drafter.load_state_dict(state, strict=True, assign=True)
        return drafter

    @torch.no_grad()
    def init_weights(self, seed: int, *, std: float = 0.02) -> Drafter:
        """Fresh random weights, reproducible from `seed`: norms 1, biases 0, linear and own
        embedding weights N(0, std). Buffers (d2t/t2d, what is borrowed) are data, left as they are."""
        g = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, (nn.Linear, nn.Embedding)) and isinstance(module.weight, nn.Parameter):
                w = module.weight
                w.copy_(torch.randn(w.shape, generator=g) * std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
        return self

    def set_vocab_map(self, d2t: Tensor, t2d: Tensor) -> None:
        """Install a vocab map (e.g. built from data for a fresh draft); checked for consistency."""
        if not self.contract.has_vocab_map:
            raise ContractError(
                "this draft's contract has no vocab map (has_vocab_map is false)",
                "build the drafter from a contract with has_vocab_map=True",
            )
        check_vocab_map(self.contract, d2t, t2d)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocab ids -> target-vocab ids (identity without a vocab map)."""
        if not self.contract.has_vocab_map:
            return draft_ids
        return draft_ids + self.d2t[draft_ids]

    def combine(self, features: Tensor) -> Tensor:
        """Fuse captured target states: [B, T, A*H_t] -> [B, T, H] (the feature norm, then fc)."""
        c = self.contract
        if features.shape[-1] != c.fc_in_features:
            raise ContractError(
                f"features are {features.shape[-1]} wide; fc reads {c.num_aux_layers} captured layers "
                f"x {c.target_hidden_size} = {c.fc_in_features}",
                "capture the target at the draft's capture_layers (eyas inspect shows them)",
            )
        if c.norm_before_fc:
            features = self.input_norm(features)
        elif c.fc_norm:
            chunks = features.split(c.target_hidden_size, dim=-1)  # A x [B, T, H_t]
            features = torch.cat([norm(x) for norm, x in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(features)

    def forward(
        self,
        hidden: Tensor,
        input_ids: Tensor,
        position_ids: Tensor,
        *,
        cache: DraftCache | None = None,
        attn_mask: Tensor | None = None,
        with_logits: bool = True,
    ) -> tuple[Tensor | None, Tensor]:
        """One draft step over T new positions -> (logits [B, T, Vd], next_hidden [B, T, H]).

        hidden [B, T, H] is `combine(features)` or the previous step's next_hidden; input_ids [B, T]
        are TARGET-vocab ids; position_ids [B, T] drive rope. With a cache the new keys/values are
        appended and queries see cache + new. attn_mask: bool [B or 1, T, cache_len + T], True =
        may attend (a tree's ancestor mask, the caller's to keep within a sliding window); None =
        causal (within the contract's `sliding_window`). `with_logits=False` returns None for the
        logits: training applies `head` to the labelled positions only.
        """
        T = hidden.shape[1]
        past = 0 if cache is None else cache.length
        if attn_mask is None:
            attn_mask = causal_mask(T, past, hidden.device, self.contract.sliding_window)
        if self.inv_freq.device != hidden.device:  # moved once, kept fp32 (see __init__)
            self.inv_freq = self.inv_freq.to(hidden.device)
        freqs = position_ids[..., None].float() * self.inv_freq  # [B, T, D/2], fp32
        angles = torch.cat([freqs, freqs], dim=-1)  # [B, T, D]
        cos = (angles.cos() * self.rope_scale).to(hidden.dtype)
        sin = (angles.sin() * self.rope_scale).to(hidden.dtype)
        embeds = self.embed_tokens(input_ids)  # [B, T, H]
        hidden = self.layers[0](hidden, cos, sin, attn_mask, cache, embeds=embeds)  # the EAGLE-3 layer
        for layer in self.layers[1:]:
            hidden = layer(hidden, cos, sin, attn_mask, cache)
        if cache is not None:
            cache.length += T  # every layer has appended T positions
        next_hidden = self.norm(hidden) if self.contract.norm_output else hidden
        return (self.head(next_hidden) if with_logits else None), next_hidden

    def head(self, next_hidden: Tensor) -> Tensor:
        """Draft-vocab logits [..., Vd] from a step's next_hidden [..., H] (normed once either way)."""
        return self.lm_head(next_hidden if self.contract.norm_output else self.norm(next_hidden))

    def forward_ttt(
        self,
        features: Tensor,
        input_ids: Tensor,
        steps: int,
        *,
        next_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
        logits: bool = True,
        masked: bool = False,
        rows: Tensor | None = None,
        keep: Callable[[int, Tensor, Tensor], Tensor] | None = None,
    ) -> list[Tensor]:
        """Training-time test: `steps` unrolled draft steps -> per-step logits, each [B, T, Vd]
        (`logits=False`: each step's next_hidden [B, T, H] instead; `head` turns any rows of it into
        logits, so training pays the lm_head only where a position has a label).

        Alignment: position t pairs features g_t (target prefix through token x_t) with
        input_ids[t] = x_{t+1}; step 0 at t predicts x_{t+2}, step j predicts x_{t+j+2}.

        Step j >= 1 at t takes the step j-1 hidden at t and a token for x_{t+j+1}:
        - teacher forcing: `next_ids` [B, T] is the label sequence of step 0 (next_ids[t] = x_{t+2},
          i.e. input_ids shifted left by one); step j reads next_ids[t + j - 1], with 0 past the end
          (those positions have no label at step j; with packed documents, positions whose t + j
          crosses into the next document have no valid label either: the loss must mask both).
        - free running (`next_ids` None): the draft's own step j-1 argmax, mapped to target ids.

        Attention: step j at t sees step-0 keys at positions <= t (same document when
        `document_ids` [B, T] is given) plus its own entries of steps 1..j; rope position of step j =
        position_ids + j (position_ids default 1 + arange(T), speculators' convention; rope is
        relative, so only differences matter; a sliding window counts back from t + j). `steps`
        calls of `forward`: by default on a `TTTCache` (`eyas.ttt_attention`: step-0 scores plus one
        diagonal column per later step, steps * T^2). `masked=True` is the reference it is tested
        against: every step's keys appended to one DraftCache under one boolean mask (`ttt_mask`),
        steps^2 * T^2.

        `rows` [R] (increasing; diagonal attention only): the positions whose outputs are wanted
        (evaluation's chain starts). Step 0 runs at every position (later steps attend to its keys),
        its logits and steps 1.. at `rows` only: outputs [B, R, ...], row for row the full unroll's.
        `keep(j, rows, step_j_output)` narrows them after step j (a bool [R_j] over the current
        rows: evaluation drops ended chains); step j's output is [B, R_j, ...] at the rows it had.
        """
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = 1 + torch.arange(T, device=input_ids.device).expand(B, T)
        mask = ttt_mask(T, steps if masked else 1, document_ids, input_ids.device)
        window = self.contract.sliding_window
        cache = DraftCache(self, B) if masked else TTTCache(self.contract.num_hidden_layers, mask, window)
        hidden, ids = self.combine(features), input_ids
        want_logits = logits or next_ids is None
        outputs = []
        for j in range(steps):
            step_mask = mask[..., : (j + 1) * T]  # step-0 block (+ masked: the diagonal blocks of steps 1..j)
            if masked and window is not None:  # block s holds position t + s in row t; the query is at t + j
                t = torch.arange(T, device=input_ids.device)
                step_mask = step_mask & in_window(t + j, torch.cat([t + s for s in range(j + 1)]), window)
            step_logits, hidden = self(hidden, ids, position_ids + j, cache=cache, attn_mask=step_mask,
                                       with_logits=want_logits and (rows is None or j > 0))
            if rows is not None and j == 0:  # steps 1.. run at `rows` only (they attend to step 0's keys)
                assert not masked, "rows needs the diagonal TTT attention"
                cache.select_rows(rows)
                hidden, position_ids = hidden[:, rows], position_ids[:, rows]
                step_logits = self.head(hidden) if want_logits else None
            outputs.append(step_logits if logits else hidden)
            if next_ids is None:
                ids = self.to_target_ids(step_logits.argmax(-1))
            if keep is not None and rows is not None and j + 1 < steps:
                kept = keep(j, rows, outputs[-1])
                if not bool(kept.all()):
                    rows = rows[kept]
                    cache.select_rows(rows, within=kept)
                    hidden, position_ids = hidden[:, kept], position_ids[:, kept]
                    ids = ids[:, kept] if next_ids is None else ids
            if next_ids is not None:  # step j + 1 at t reads next_ids[t + j]
                ids = shift_left(next_ids, j) if rows is None else shift_left(next_ids, j)[:, rows]
        return outputs
