"""THE validator of a draft's tensors against its contract, the vocab map included: one rule each.

Every finding has a stable code (eyas.codes). `read_checkpoint`, `write_checkpoint`, `eyas check`
and the drafter (`eyas.drafter.check_vocab_map`) all apply these rules and no others.
"""

from __future__ import annotations

import torch

from eyas.codes import finding
from eyas.contract import IDS, DraftContract, expected_shapes

_VOCAB_MAP = ("d2t", "t2d")
# tensors whose shape, when no specific explanation fits, still points at one fault
_GENERIC_SHAPE_CODES = {
    "fc.weight": "fc_shape",
    "embed_tokens.weight": "embed_tokens_shape",
    "lm_head.weight": "lm_head_shape",
}


def _shape(shape: torch.Size | tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() else None


def _is_feature_norm(name: str) -> bool:
    """input_norm (norm_before_fc) and fc_norm.{i} (fc_norm): the tensors the feature-norm flags add."""
    return name == "input_norm.weight" or name.startswith("fc_norm.")


def _flag_for(name: str) -> tuple[str, str] | None:
    """The config setting that decides whether an optional tensor exists: (setting, value that adds it)."""
    if name == "input_norm.weight":
        return "norm_before_fc", "true"
    if name.startswith("fc_norm."):
        return "fc_norm", "true"
    if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
        return "layer type (model_type)", "qwen3"
    if name.endswith("_proj.bias") and ".self_attn." in name:
        return "attention_bias", "true"
    return None


def tensor_problems(c: DraftContract, tensors: dict[str, torch.Tensor]) -> list[dict[str, str]]:
    """Every way `tensors` (canonical names) contradict `c`: missing, unexpected, misshapen, nan/inf, bad vocab map."""
    expected = {n: s for n, s in expected_shapes(c).items() if n not in _VOCAB_MAP}  # vocab_map_problems' part
    stored_layers = {_layer_index(n) for n in tensors}
    out: list[dict[str, str]] = []
    for i in sorted({_layer_index(n) for n in expected} - stored_layers - {None, 0}):
        out.append(
            finding(
                "layers_missing",
                f"layers.{i}",
                f"num_hidden_layers is {c.num_hidden_layers} but no layers.{i}.* are stored",
                "set num_hidden_layers to the number of stored layers",
            )
        )
    for i in sorted(i for i in stored_layers - {None} if i >= c.num_hidden_layers):
        out.append(
            finding(
                "layers_extra",
                f"layers.{i}",
                f"layers.{i}.* are stored but num_hidden_layers is {c.num_hidden_layers}",
                "set num_hidden_layers to the number of stored layers",
            )
        )
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is not None:
            if tuple(t.shape) != shape:
                out.append(_wrong_shape(c, name, t, shape))
            if not t.is_floating_point():  # a weight of integers or booleans: no layer multiplies by it
                out.append(
                    finding(
                        "tensor_dtype",
                        name,
                        f"{name} is {t.dtype}, expected a floating-point dtype",
                        "store the weights as bfloat16, float16 or float32 (the header's dtype may be corrupt)",
                    )
                )
            elif (bad := not_finite(name, t)) is not None:
                out.append(bad)
        elif _layer_index(name) in stored_layers or _layer_index(name) is None:
            out.append(_missing(name))
    mapped = set(_VOCAB_MAP) if c.has_vocab_map else set()
    out += [_unexpected(n) for n in sorted(tensors.keys() - expected.keys() - mapped) if _is_unexpected(c, n)]
    return out + _unshareable_embeddings(c, tensors) + vocab_map_problems(c, tensors)


def _unshareable_embeddings(c: DraftContract, tensors: dict[str, torch.Tensor]) -> list[dict[str, str]]:
    """A draft whose config makes it narrower or wider than its target needs its own embed_tokens: the
    target's are target_hidden_size wide, so no target can lend them (the config alone says so, as a
    reduced vocab says it needs d2t). vLLM 0.32 then keeps the draft's own table, never loaded
    (v1/spec_decode/llm_base_proposer.py shares only a table of the same width)."""
    if c.target_hidden_size == c.hidden_size or "embed_tokens.weight" in tensors:
        return []
    return [finding(
        "target_embeddings_unshareable",
        "embed_tokens.weight",
        f"target_hidden_size {c.target_hidden_size} != hidden_size {c.hidden_size} and the draft has no "
        f"embed_tokens: the target's embeddings are {c.target_hidden_size} wide, the draft's layer takes "
        f"{c.hidden_size}",
        "export the draft's own embed_tokens",
    )]


def not_finite(name: str, t: torch.Tensor) -> dict[str, str] | None:
    """The finding on a weight holding nan or inf (a run that diverged, a corrupt file): every draft
    output it feeds is nan. One min/max pass per tensor (nan propagates through both; 0.02 s for 0.42B
    bf16 values, an 8B target's draft, where isfinite().all() took 1 s on the 2-core AVX-512 EPYC); the values are
    counted only when some are not finite. Training checks its weights with it before it writes them."""
    if t.dtype.itemsize == 1:  # float8: neither aminmax nor isfinite is implemented for every kind
        t = t.float()
    if t.numel() == 0 or all(bool(v.isfinite()) for v in t.aminmax()):
        return None
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    return finding(
        "tensor_not_finite",
        name,
        f"{name} holds {nan} nan and {inf} inf of its {t.numel()} values",
        "the weights are corrupt or training diverged: retrain or restore them",
    )


def _is_unexpected(c: DraftContract, name: str) -> bool:
    i = _layer_index(name)
    return i is None or i < c.num_hidden_layers  # tensors of layers beyond num_hidden_layers: reported per layer


def _missing(name: str) -> dict[str, str]:
    flag = _flag_for(name)
    if flag is None:
        return finding("tensor_missing", name, f"{name} is missing", "the checkpoint is incomplete")
    return finding(
        "feature_norm_missing" if _is_feature_norm(name) else "flag_tensor_missing",
        name,
        f"{name} is missing ({flag[0]} is {flag[1]})",
        f"set {flag[0]} correctly, or add the trained {name}",
    )


# SGLang's LlamaForCausalLMEagle3 builds fc with `bias=config.bias` (eagle3-eagle-specforge-sglang.md 4.1);
# vLLM 0.32's fc has bias=False (models/llama_eagle3.py), as do speculators and eyas
_FC_BIAS = ("SGLang alone builds fc with a bias (config 'bias': true); vLLM, speculators and eyas have none, so "
            "they would drop a trained one: serve such a draft in SGLang, or retrain fc without a bias")


def _unexpected(name: str) -> dict[str, str]:
    flag = _flag_for(name)
    if flag is None:
        fc_bias = name == "fc.bias"
        return finding(
            "tensor_unknown",
            name,
            f"{name} is not a tensor eyas, vLLM or speculators load" if fc_bias else f"{name} is not an EAGLE-3 tensor",
            _FC_BIAS if fc_bias else "remove it: no EAGLE-3 loader has such a parameter",
        )
    return finding(
        "feature_norm_unexpected" if _is_feature_norm(name) else "flag_tensor_unexpected",
        name,
        f"{name} is present but {flag[0]} is not {flag[1]}",
        f"set {flag[0]} to {flag[1]} (engines ignore or reject the tensor otherwise)",
    )


def _wrong_shape(c: DraftContract, name: str, t: torch.Tensor, shape: tuple[int, ...]) -> dict[str, str]:
    """A misshapen tensor, explained by the config field that most likely disagrees with it."""
    got, want, ht = _shape(t.shape), _shape(shape), c.target_hidden_size
    matrix = t.ndim == len(shape) == 2  # a vector stored as [1, H] (or a matrix as a vector) is only misshapen
    same_rows = matrix and t.shape[0] == shape[0]
    same_cols = matrix and t.shape[1] == shape[1]
    if name == "fc.weight" and same_rows and t.shape[1] % ht == 0:
        a = t.shape[1] // ht
        ids = (
            "no layer ids"
            if c.capture_layers is None
            else f"{c.num_aux_layers} capture layers {list(c.capture_layers)}"
        )
        return finding(
            "fc_chunks",
            name,
            f"fc.weight is {got} = {a} chunks of target_hidden_size {ht}, but the config names {ids} ({IDS})",
            f"set {IDS} to the {a} target layers the draft was trained on",
        )
    if name == "fc.weight" and same_rows:
        return finding(
            "fc_shape",
            name,
            f"fc.weight is {got}: width {t.shape[1]} is not a multiple of target_hidden_size {ht}",
            "set target_hidden_size to the target's hidden size",
        )
    if name == "lm_head.weight" and same_cols:
        return finding(
            "lm_head_shape",
            name,
            f"lm_head.weight is {got}, expected {want} (draft_vocab_size {c.draft_vocab_size})",
            f"set draft_vocab_size to {t.shape[0]}",
        )
    if name == "embed_tokens.weight" and same_cols:
        return finding(
            "embed_tokens_shape",
            name,
            f"embed_tokens.weight is {got}, expected {want} (vocab_size {c.vocab_size})",
            f"vocab_size is the TARGET's vocab: set it to {t.shape[0]}",
        )
    if name.startswith("layers.0.self_attn.") and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return finding(
            "tensor_shape",
            name,
            f"{name} is {got}, expected {want} (layer 0 reads cat(embedding, hidden): 2 x hidden_size {c.hidden_size})",
            "check hidden_size, num_attention_heads, num_key_value_heads and head_dim",
        )
    return finding(
        _GENERIC_SHAPE_CODES.get(name, "feature_norm_shape" if _is_feature_norm(name) else "tensor_shape"),
        name,
        f"{name} is {got}, expected {want}",
        "the config's dims (hidden_size, heads, head_dim, intermediate_size) disagree with the weights",
    )


def vocab_map_problems(c: DraftContract, tensors: dict[str, torch.Tensor]) -> list[dict[str, str]]:
    """The one vocab-map rule: d2t int64 [Vd] offsets with arange + d2t strictly increasing inside [0, V);
    t2d bool [V] marking exactly those Vd target ids.

    Engines only read d2t (target id = draft id + d2t[draft id]), in any order. The order matters to
    whatever reads the map from t2d alone: a mask can only say "the i-th drafted target id, ascending".
    SpecForge and speculators train by indexing the target's logits with t2d, and eyas rebuilds a
    map from t2d when d2t is unusable; an unsorted d2t gives those a different map than the engines'.
    """
    V, Vd = c.vocab_size, c.draft_vocab_size
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None and t2d is None and c.reduced_vocab:
        return [
            finding(
                "vocab_map_missing",
                "d2t",
                f"draft_vocab_size {Vd} < vocab_size {V} but there is no d2t/t2d: engines would take draft id i "
                "as target id i",
                "add the d2t/t2d vocab map from the training run",
            )
        ]
    out, targets = [], None
    for name, other, size, n in (("d2t", "t2d", "draft_vocab_size", Vd), ("t2d", "d2t", "vocab_size", V)):
        t = tensors.get(name)
        if t is None and c.has_vocab_map:
            out.append(
                finding(
                    f"{name}_missing",
                    name,
                    f"{name} is missing" + (f" ({other} is present)" if other in tensors else ""),
                    _map_fix(name, other in tensors),
                )
            )
        elif t is not None and tuple(t.shape) != (n,):
            out.append(
                finding(
                    "vocab_map_shape",
                    name,
                    f"{name} is {_shape(t.shape)}, expected {_shape((n,))} ({size})",
                    f"set {size} to match, or rebuild the map",
                )
            )
    if d2t is not None and tuple(d2t.shape) == (Vd,):
        found, targets = _d2t_problems(d2t.cpu(), V)
        out = found + out  # a broken d2t first: a valid one alone would be read whole (complete_vocab_map)
    if t2d is not None and tuple(t2d.shape) == (V,):
        out += _t2d_problems(t2d.cpu(), Vd, targets)
    return out


def _map_fix(missing: str, other_stored: bool) -> str:
    """How to store the missing half of the vocab map from the half that is there (t2d marks the drafted
    target ids; d2t[i] is the i-th of them, ascending, less i)."""
    if missing == "d2t" and other_stored:
        return "store d2t = t2d.nonzero().flatten() - arange(draft_vocab_size) (int64)"
    if missing == "t2d" and other_stored:
        return "store t2d: true exactly at arange(draft_vocab_size) + d2t (bool, vocab_size long)"
    return "store both from the training run: t2d marks the drafted target ids, d2t[i] = target_id[i] - i"


# the findings of a vocab map read whole (complete_vocab_map): what convert writes is not bit-identical to them
VOCAB_MAP_COMPLETED = ("t2d_derived", "d2t_cast", "t2d_cast")


def complete_vocab_map(
    c: DraftContract, tensors: dict[str, torch.Tensor], where: str
) -> tuple[dict[str, torch.Tensor], list[dict[str, str]]]:
    """`tensors` with the vocab map the engines serve made whole, and a warning for each thing filled in.

    Engines read d2t alone and cast it on load (vLLM copies it into an int64 parameter, SGLang adds an
    int64 arange), so a draft storing a valid d2t without t2d, or as int32, or a t2d of integer 0s and 1s,
    is served as intended: its map is completed here (t2d derived from d2t, d2t cast to int64, t2d cast to
    bool) instead of refused. Only a d2t of the right shape whose values pass the rule is completed;
    anything else is left to vocab_map_problems.
    """
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    integer = d2t is not None and _integers(d2t)
    mask = t2d is not None and _integers(t2d) and tuple(t2d.shape) == (c.vocab_size,) \
        and bool(((t2d == 0) | (t2d == 1)).all())  # 0s and 1s: a mask stored as integers
    whole = t2d is not None and t2d.dtype == torch.bool and integer and d2t.dtype == torch.int64  # the common case
    if whole or not integer or tuple(d2t.shape) != (c.draft_vocab_size,):
        return tensors, []
    _, targets = _d2t_problems(d2t.cpu(), c.vocab_size)  # its findings are the validator's to report
    if targets is None:
        return tensors, []
    out, said = dict(tensors), []
    if d2t.dtype != torch.int64:
        out["d2t"] = d2t.long()
        said.append(finding("d2t_cast", "d2t", f"{where}d2t is {d2t.dtype}: read as int64 offsets, as engines "
                            "cast it on load", "none needed; eyas convert stores it as int64"))
    if mask:
        out["t2d"] = t2d.bool()
        said.append(finding("t2d_cast", "t2d", f"{where}t2d is {t2d.dtype} of 0s and 1s: read as the bool mask it "
                            "stores (engines read d2t only)", "none needed; eyas convert stores it as bool"))
    if t2d is None:
        out["t2d"] = torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, targets, True)
        said.append(finding("t2d_derived", "t2d", f"{where}no t2d: derived from d2t (vLLM, SGLang and llama.cpp read "
                            "d2t only; speculators needs t2d stored)", "none to serve it; for speculators, eyas convert "
                            "stores both"))
    return out, said


def _integers(t: torch.Tensor) -> bool:
    """An integer tensor (bool is not one: a d2t of bools is no offsets, a t2d of bools needs no cast)."""
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _d2t_problems(d2t: torch.Tensor, V: int) -> tuple[list[dict[str, str]], torch.Tensor | None]:
    """Findings on a [Vd] d2t, and the target ids it maps to (None when they are not a valid map)."""
    out = []
    if d2t.dtype != torch.int64:
        out.append(
            finding("d2t_dtype", "d2t", f"d2t is {d2t.dtype}, expected torch.int64", "store d2t as int64 offsets")
        )
    targets = torch.arange(d2t.shape[0]) + d2t.long()  # target_id = draft_id + d2t[draft_id]
    outside = ((targets < 0) | (targets >= V)).nonzero().flatten()
    rising = bool((targets[1:] > targets[:-1]).all())
    if len(outside):
        i = int(outside[0])
        out.append(
            finding(
                "d2t_out_of_range",
                "d2t",
                f"d2t maps draft id {i} to target id {int(targets[i])}, outside [0, {V})",
                "d2t holds offsets: d2t[i] = target_id[i] - i",
            )
        )
    elif not rising:
        i = int((targets[1:] <= targets[:-1]).nonzero()[0]) + 1
        out.append(
            finding(
                "d2t_not_increasing",
                "d2t",
                f"arange + d2t is not strictly increasing at draft id {i} (target ids "
                f"{int(targets[i - 1])}, {int(targets[i])})",
                "d2t holds offsets to target ids sorted ascending: d2t[i] = sorted_ids[i] - i",
            )
        )
    return out, None if len(outside) or not rising else targets


def _t2d_problems(t2d: torch.Tensor, Vd: int, targets: torch.Tensor | None) -> list[dict[str, str]]:
    """Findings on a [V] t2d; `targets` (d2t's valid map, if any) must be exactly the ids it marks."""
    out = []
    if t2d.dtype != torch.bool:
        out.append(
            finding(
                "t2d_dtype",
                "t2d",
                f"t2d is {t2d.dtype}, expected torch.bool",
                "store t2d as a bool mask over the target vocab",
            )
        )
    mask = t2d.bool()
    count = int(mask.sum())
    if count != Vd:
        out.append(
            finding(
                "t2d_count",
                "t2d",
                f"t2d marks {count} target ids, expected draft_vocab_size {Vd}",
                "rebuild t2d: t2d[j] is true exactly for j in arange(Vd) + d2t",
            )
        )
    elif targets is not None and not bool(mask[targets].all()):
        j = int(targets[~mask[targets]][0])
        out.append(
            finding(
                "t2d_disagrees",
                "t2d",
                f"t2d disagrees with d2t: target id {j} is a draft token but t2d[{j}] is false",
                "rebuild t2d from d2t",
            )
        )
    return out
