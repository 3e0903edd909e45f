"""The EAGLE-3 draft contract: what a draft needs from whoever runs it, independent of file format.

Every reader in `eyas.formats` converts a checkpoint's config into a `DraftContract`; every writer
converts out of it. Everything else in eyas (drafter, target capture, eval, decode, doctor) reads
only this dataclass. What a target's own config says (`target_facts`) is read here too, so that
formats and checks depend on this module and never the other way round.

`capture_layers` has ONE meaning everywhere in eyas: index k is the residual stream ENTERING target
decoder layer k (0-based), i.e. Hugging Face `output_hidden_states[k]`, where index 0 is the
embeddings. This is vLLM's and the original EAGLE code's convention. Engines that use "output of
layer i" ids (SpecForge, SGLang's +1 rule) are converted at the format boundary, never here.

Canonical tensor names follow speculators (`layers.{i}.*`); the only other on-disk naming, the
original EAGLE `midlayer.*`, is one rename rule in `eyas.weights`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from eyas.codes import finding
from eyas.errors import ContractError, FormatError

LAYER_TYPES = ("llama", "qwen3")
DEFAULT_ROPE_THETA = 10000.0  # what every engine builds when a draft config names no rope theta
IDS = "eagle_aux_hidden_state_layer_ids"  # the config key that records capture_layers, in every format


ROPE_TYPES = ("default", "dynamic", "linear", "llama3", "yarn")  # the rope scalings eyas's drafter turns (eyas.rope)


def language_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a target's config.json: a multimodal one nests it in `text_config`, beside
    sizes of other parts (PaliGemma's outer hidden_size and vocab_size are the projector's and the whole
    model's); a config with num_hidden_layers at the top (older flat Qwen2-VL exports) is its own."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) and "num_hidden_layers" not in cfg else cfg


def target_facts(cfg: dict[str, Any], where: str = "the target's config.json") -> dict[str, Any]:
    """What a target (verifier) config.json says about its language model (`language_config`; a field it
    lacks, from the outer config). Its sizes, where given, are positive integers (else one line naming `where`
    and the field): every comparison with a draft is arithmetic on them."""
    text = language_config(cfg)

    def pick(key: str) -> Any:
        return text[key] if text.get(key) is not None else cfg.get(key)

    for key in ("num_hidden_layers", "hidden_size", "vocab_size", "max_position_embeddings"):
        if pick(key) is not None:
            target_size(where, {key: pick(key)}, key)
    rope = pick("rope_parameters") if isinstance(pick("rope_parameters"), dict) else {}
    return {
        "name_or_path": cfg.get("_name_or_path") or None,
        "architectures": tuple(cfg.get("architectures") or ()),
        "num_hidden_layers": pick("num_hidden_layers"),
        "hidden_size": pick("hidden_size"),
        "vocab_size": pick("vocab_size"),
        "max_position_embeddings": pick("max_position_embeddings"),
        "rope_theta": pick("rope_theta") if pick("rope_theta") is not None else rope.get("rope_theta"),
    }


def default_capture_layers(num_target_layers: int) -> tuple[int, ...]:
    """The engines' fallback when a draft names no layers: inputs of layers 2, N//2 and N-3."""
    n = num_target_layers
    return (2, n // 2, n - 3)


@dataclass(frozen=True)
class Verifier:
    """The target ("verifier") the draft was trained against, as far as the checkpoint says."""

    name_or_path: str | None = None
    architectures: tuple[str, ...] = ()
    num_hidden_layers: int | None = None  # known only from a verifier config or a target
    hidden_size: int | None = None
    vocab_size: int | None = None
    # the target's model_type as the draft's trainer recorded it (SpecForge's `target_model_type`); a Gemma
    # type says its trainer may have scaled the draft's embeddings (eyas.formats.specforge)
    model_type: str | None = None


@dataclass(frozen=True)
class DraftContract:
    """Everything a drafter needs, in eyas's own conventions. Build with keywords."""

    # --- the draft decoder (one Llama or Qwen3 layer, attention input 2H on layer 0) ---
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the TARGET's vocabulary: embed_tokens rows, t2d length
    draft_vocab_size: int  # lm_head rows; < vocab_size needs d2t/t2d
    target_hidden_size: int  # width of each captured target state
    capture_layers: tuple[int, ...] | None  # None: the checkpoint names none (engines guess)
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float | None = None  # None: the config names none; engines then use 10000
    rope_scaling: dict[str, Any] | None = None  # HF rope_scaling dict (rope_type, factor, ...)
    max_position_embeddings: int = 2048
    layer_type: str = "llama"  # "qwen3" adds q_norm/k_norm; another type only with `unsupported`
    hidden_act: str = "silu"
    attention_bias: bool = False
    # the draft layer attends over its last N tokens, itself included (`layer_types` "sliding_attention",
    # `sliding_window`); None: over the whole context. The drafter applies it as vLLM does
    # (eyas.ttt_attention.in_window; pinned by serve-check, tests/test_engine_vllm.py)
    sliding_window: int | None = None
    # --- norm flags (engine defaults differ: always written explicitly) ---
    norm_before_residual: bool = False  # residual = hidden_norm(h) instead of raw h
    norm_before_fc: bool = False  # one RMSNorm (input_norm) over the concatenated features
    fc_norm: bool = False  # one RMSNorm per captured chunk (fc_norm.{i}), EAGLE-3.1
    norm_output: bool = False  # next step gets norm(out) instead of pre-norm out, EAGLE-3.1
    # --- what the checkpoint carries ---
    has_embeddings: bool = False  # False: the target's embed_tokens are shared
    has_vocab_map: bool = False  # d2t and t2d present
    has_lm_head: bool = True  # False: a full-vocab draft without lm_head.weight reads the target's lm_head
    num_aux_layers: int | None = None  # chunks fc reads; defaults to len(capture_layers)
    # the factor the draft's trainer multiplied its token embeddings by, as its config states it (SpecForge's
    # `embed_scale`); None: not stated. No engine's EAGLE-3 draft applies it, nor eyas: it is kept so every
    # config eyas writes says it again (eyas.formats.specforge warns)
    embed_scale: float | None = None
    verifier: Verifier = field(default_factory=Verifier)
    # the part of the draft eyas has no code for (a mixture-of-experts MLP, latent attention, ...), named
    # for the user; None: eyas runs it. Such a draft is read and checked, never run (eyas.drafter_checks)
    unsupported: str | None = None

    def __post_init__(self) -> None:
        if self.capture_layers is not None:
            object.__setattr__(self, "capture_layers", tuple(int(k) for k in self.capture_layers))
            if self.num_aux_layers is None:
                object.__setattr__(self, "num_aux_layers", len(self.capture_layers))
            elif self.num_aux_layers != len(self.capture_layers):
                raise ContractError(
                    f"capture_layers {list(self.capture_layers)} names {len(self.capture_layers)} "
                    f"layers but fc reads {self.num_aux_layers} chunks",
                    "make the layer ids match the width of fc.weight",
                )
        if self.num_aux_layers is None:
            object.__setattr__(self, "num_aux_layers", 3)
        if self.layer_type not in LAYER_TYPES and self.unsupported is None:
            raise ContractError(
                f"layer type {self.layer_type!r} is not supported",
                f"use one of {', '.join(LAYER_TYPES)}",
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ContractError(f"sliding_window {self.sliding_window} is not a window",
                                "set a positive number of tokens, or None for full attention")
        if self.norm_before_fc and self.fc_norm:
            raise ContractError(
                "norm_before_fc and fc_norm are both set; a draft has at most one feature norm",
                "set one of them to false",
            )
        if self.draft_vocab_size > self.vocab_size:
            raise ContractError(
                f"draft_vocab_size {self.draft_vocab_size} exceeds the target vocab {self.vocab_size}",
                "draft_vocab_size must be <= vocab_size (the target's)",
            )
        if not self.has_lm_head and (self.reduced_vocab or self.has_vocab_map):
            raise ContractError(
                f"a draft of {self.draft_vocab_size} of the target's {self.vocab_size} tokens needs its own lm_head "
                "(the target's has a row for every token)",
                "add lm_head.weight, or share the target's with the full vocab and no d2t/t2d",
            )

    # --- derived facts, in one place ---
    @property
    def reduced_vocab(self) -> bool:
        """True when the draft predicts a subset of the target vocab (then d2t/t2d are required)."""
        return self.draft_vocab_size < self.vocab_size

    @property
    def rope_base(self) -> float:
        """The rope theta a drafter actually uses: engines build 10000 when none is named."""
        return DEFAULT_ROPE_THETA if self.rope_theta is None else float(self.rope_theta)

    @property
    def fc_in_features(self) -> int:
        return self.num_aux_layers * self.target_hidden_size

    def replace(self, **changes: Any) -> DraftContract:
        return dataclasses.replace(self, **changes)

    def verifier_named(self, name: str | None) -> DraftContract:
        """This contract with its verifier recorded as `name` (--verifier-name: what engines load), or as it is."""
        return self if name is None else self.replace(verifier=dataclasses.replace(self.verifier, name_or_path=name))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the field names above (capture_layers as a list)."""
        d = dataclasses.asdict(self)
        d["capture_layers"] = None if self.capture_layers is None else list(self.capture_layers)
        d["verifier"]["architectures"] = list(self.verifier.architectures)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DraftContract:
        d = dict(d)
        v = dict(d.pop("verifier", None) or {})
        v["architectures"] = tuple(v.get("architectures") or ())
        return cls(**d, verifier=Verifier(**v))


def expected_shapes(c: DraftContract) -> dict[str, tuple[int, ...]]:
    """Canonical tensor name -> shape for a checkpoint that satisfies `c`.

    Optional tensors appear only when the contract says they exist (embeddings, vocab map,
    input_norm, fc_norm, q/k norms). Layer 0 reads cat(embedding, hidden): q/k/v take 2H.
    """
    H, I, D = c.hidden_size, c.intermediate_size, c.head_dim
    q_out, kv_out = c.num_attention_heads * D, c.num_key_value_heads * D
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (H, c.fc_in_features)}
    if c.has_embeddings:
        shapes["embed_tokens.weight"] = (c.vocab_size, H)
    if c.norm_before_fc:
        shapes["input_norm.weight"] = (c.fc_in_features,)
    if c.fc_norm:
        for i in range(c.num_aux_layers):
            shapes[f"fc_norm.{i}.weight"] = (c.target_hidden_size,)
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        attn_in = 2 * H if i == 0 else H
        shapes[p + "self_attn.q_proj.weight"] = (q_out, attn_in)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, attn_in)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, attn_in)
        shapes[p + "self_attn.o_proj.weight"] = (H, q_out)
        if c.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_out,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_out,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_out,)
            shapes[p + "self_attn.o_proj.bias"] = (H,)  # HF Llama/Qwen3 bias every projection
        if c.layer_type == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (D,)
            shapes[p + "self_attn.k_norm.weight"] = (D,)
        shapes[p + "input_layernorm.weight"] = (H,)
        if i == 0:
            shapes[p + "hidden_norm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        shapes[p + "mlp.gate_proj.weight"] = (I, H)
        shapes[p + "mlp.up_proj.weight"] = (I, H)
        shapes[p + "mlp.down_proj.weight"] = (H, I)
    shapes["norm.weight"] = (H,)
    if c.has_lm_head:
        shapes["lm_head.weight"] = (c.draft_vocab_size, H)
    if c.has_vocab_map:
        shapes["d2t"] = (c.draft_vocab_size,)  # int64 offsets: target_id = draft_id + d2t[draft_id]
        shapes["t2d"] = (c.vocab_size,)  # bool mask over the target vocab, draft_vocab_size true
    return shapes


_RECORD_IDS = f"write the layers the draft was trained on into its config ({IDS})"


def capture_layer_problems(c: DraftContract, num_target_layers: int) -> list[dict[str, str]]:
    """Findings on `capture_layers` against a target of `num_target_layers` decoder layers.

    Index N (the last layer's output, before the final norm) is a valid capture point; beyond
    that nothing exists.
    """
    if c.capture_layers is None:
        return [
            finding(
                "capture_layers_not_recorded",
                IDS,
                "capture_layers are not recorded: engines fall back to "
                f"{list(default_capture_layers(num_target_layers))}, which may not be what the draft was trained on",
                _RECORD_IDS,
            )
        ]
    return layer_problems(c.capture_layers, num_target_layers)


def layer_problems(layers: Sequence[int], num_target_layers: int) -> list[dict[str, str]]:
    """The rule on capture layers, wherever they come from (a draft's contract, capture's flag or the
    engines' default): each within 0..N, strictly increasing."""
    bad = [k for k in layers if not 0 <= k <= num_target_layers]
    problems = []
    if bad:
        problems.append(
            finding(
                "capture_layers_out_of_range",
                IDS,
                f"capture_layers {list(layers)}: {bad} outside the target's "
                f"0..{num_target_layers} (it has {num_target_layers} decoder layers)",
                _RECORD_IDS,
            )
        )
    if list(layers) != sorted(set(layers)):
        problems.append(
            finding(
                "capture_layers_not_increasing",
                IDS,
                f"capture_layers {list(layers)} are not strictly increasing: "
                "features are concatenated in this order, check it is the order the draft was trained on",
                _RECORD_IDS,
            )
        )
    return problems


def check_capture_layers(c: DraftContract, num_target_layers: int) -> list[str]:
    """The texts of `capture_layer_problems`, for callers that raise on the first one."""
    return [f["problem"] for f in capture_layer_problems(c, num_target_layers)]


# what other model families call the sizes Llama-style configs name (GPT-2, GPT-J, T5, MPT, ...)
_OTHER_SPELLINGS = {"num_hidden_layers": ("n_layer", "n_layers", "num_layers"), "hidden_size": ("n_embd", "d_model"),
                    "num_attention_heads": ("n_head", "n_heads", "num_heads")}


def target_size(where: str, text: dict[str, Any], key: str) -> int:
    """A dimension read from a target's config (`text`: its language model's part; `where` names the
    file): a positive integer, or one line naming the field. A draft's config passed as the target,
    or a damaged one, fails here rather than in shape arithmetic."""
    value = text.get(key)
    other = [k for k in _OTHER_SPELLINGS.get(key, ()) if k in text]
    if value is None and other:  # GPT-2 says n_layer: another family's config, not a damaged one
        raise FormatError(f"{where}: no field {key!r} but {other[0]!r} (model_type {text.get('model_type')!r}): eyas "
                          "runs Llama-style decoders, whose configs name it", "use a Llama-style target (Llama, "
                          "Qwen2/3, Mistral, ...)")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise FormatError(f"{where}: field {key!r} is {value!r}, not a positive integer",
                          "pass the target's own config.json (restore it if it is damaged)")
    return value


def contract_for_target(
    cfg: dict[str, Any],
    *,
    capture_layers: tuple[int, ...] | None = None,
    draft_vocab_size: int | None = None,
    name: str | None = None,
) -> DraftContract:
    """A draft contract that mirrors a target's decoder layer (as speculators' trainer does).

    cfg: the target's config.json. capture_layers default to the engines' (2, N//2, N-3), so a
    draft trained with eyas is wired the same way whether or not a consumer reads its ids.
    draft_vocab_size default: the full target vocab (no vocab map).
    """
    f = target_facts(cfg)
    text = language_config(cfg)
    N, H, V = f["num_hidden_layers"], f["hidden_size"], f["vocab_size"]
    where = f"target {name} config.json" if name else "the target's config.json"
    heads = target_size(where, text, "num_attention_heads")

    rope = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else {}
    scaling = text.get("rope_scaling") or {k: v for k, v in rope.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in ROPE_TYPES and kind is not None:
        # a draft's rope is its own (EAGLE-3's turn at theta 10000 whatever the target's): longrope switches its
        # factors as a sequence passes its original length, mrope turns 3-D positions; the drafter runs neither
        warnings.warn(f"the target's rope_scaling {kind!r} is not mirrored: the draft turns plain rope at the "
                      "target's theta, as every engine and eyas's drafter run it alike", stacklevel=2)
    scaling = scaling if kind in ROPE_TYPES and kind != "default" else None
    vd = V if draft_vocab_size is None else draft_vocab_size
    defaulted = capture_layers is None
    contract = DraftContract(
        hidden_size=H,
        num_attention_heads=heads,
        num_key_value_heads=text.get("num_key_value_heads") or heads,
        # MLA (DeepSeek-V2/V3, Kimi-K2): `head_dim`, where transformers writes it, is the rotary part of a query
        # head, not an attention head's width: the draft's heads split the hidden state (R1's published draft)
        head_dim=H // heads if text.get("kv_lora_rank") else text.get("head_dim") or H // heads,
        intermediate_size=target_size(where, text, "intermediate_size"),
        vocab_size=V,
        draft_vocab_size=vd,
        target_hidden_size=H,
        capture_layers=default_capture_layers(N) if defaulted else tuple(capture_layers),
        rms_norm_eps=text.get("rms_norm_eps", 1e-6),
        rope_theta=f["rope_theta"],
        rope_scaling=scaling,
        max_position_embeddings=f["max_position_embeddings"] or 2048,
        layer_type="qwen3" if text.get("model_type", "").startswith("qwen3") else "llama",
        hidden_act=text.get("hidden_act", "silu"),
        attention_bias=bool(text.get("attention_bias", False)),
        has_vocab_map=vd < V,
        verifier=Verifier(
            name_or_path=name or f["name_or_path"],
            architectures=f["architectures"],
            num_hidden_layers=N,
            hidden_size=H,
            vocab_size=V,
        ),
    )
    problems = check_capture_layers(contract, N)
    if problems:  # a draft written with them would be refused by every loader, eyas's first
        why = f"the default (2, N//2, N-3) for {N} layers: " if defaulted else ""
        raise ContractError(f"{name or f['name_or_path'] or 'the target'}: {why}{'; '.join(problems)}",
                            f"pass --capture-layers a,b,c with 0 <= a < b < c <= {N}")
    return contract
