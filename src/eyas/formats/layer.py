"""Which decoder layer a draft config describes, and whether eyas can run it.

Engines build a draft from the class `architectures` names (SGLang resolves architectures[0] in its
model registry, vLLM maps EAGLE-3 architectures to its draft classes), not from `model_type`, which
trainers often copy from the target (SpecForge writes `phi3` or `qwen2` next to
`LlamaForCausalLMEagle3`, a Llama layer). So the layer is read in this order:

1. a class eyas knows builds a Llama or Qwen3 layer (`LlamaForCausalLMEagle3`, vLLM's
   `Eagle3LlamaForCausalLM`, EAGLE's plain `LlamaForCausalLM`, ...): that layer, whatever else the
   config carries (a dense Llama class ignores expert counts copied from the target);
2. otherwise the layer's own fields: latent attention (`kv_lora_rank`) or experts (`num_experts`,
   `n_routed_experts`, a `*_moe` model type, a NextN/MTP class) name parts eyas has no code for;
3. otherwise `model_type` when it is `llama` or `qwen3`; anything else is read as llama with a
   warning (the EAGLE-3 draft classes of every engine build Llama layers).

One exception to 1: a dense class beside `model_type: "qwen3"` is how eyas writes a qwen3 layer in the
flat schema, so the weights decide: q_norm/k_norm there make it qwen3, their absence the class's
layer (a model_type copied from a Qwen3 target, as trainers copy phi3 or qwen2).

A draft with a part eyas cannot run is still read (its contract, capture layers and what each
engine does with it); only running it is refused (eyas.drafter_checks.check_runnable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eyas.contract import LAYER_TYPES
from eyas.formats.values import show

# speculators' own classes: the layer is transformer_layer_config's, decided by its model_type
SPECULATORS_ARCHS = ("Eagle3Speculator", "Eagle3DraftModel")
_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def parallel_drafter(arch: str) -> bool:
    """Whether an architecture names a P-EAGLE draft (SpecForge's PEagleDraftModel, vLLM's Peagle*ForCausalLM):
    it drafts k tokens in one pass from mask-token placeholders, where eyas drafts in a chain."""
    return "peagle" in arch.lower()


@dataclass(frozen=True)
class DraftLayer:
    """The contract's `layer_type` and `unsupported`, and how they were decided."""

    layer_type: str  # llama / qwen3; the config's own model type when eyas cannot run the layer
    origin: str
    assumed: bool = False
    unsupported: str | None = None  # the part eyas cannot run, named; None when it runs
    unknown_model_type: str | None = None  # a model_type read as another layer (a warning)
    class_layer: str | None = None  # the layer architectures[0] builds, where model_type named another one


def _dense_class(archs: tuple[str, ...]) -> str | None:
    """"llama" / "qwen3" when architectures[0] is a dense EAGLE-3 (or plain) class of that layer."""
    if not archs or archs[0] in SPECULATORS_ARCHS:
        return None
    name = archs[0].lower()
    if any(k in name for k in ("moe", "nextn", "mtp", "deepseek")) or parallel_drafter(name):
        return None
    if "llama" in name or name.endswith("vlforcausallm"):  # Eagle3Qwen3vl / Eagle3Qwen2_5vl: Llama layers (vLLM)
        return "llama"
    if "qwen3" in name:
        return "qwen3"
    return None


def _unrunnable_parts(cfg: dict[str, Any], archs: tuple[str, ...]) -> list[str]:
    """The parts of a (non-dense-class) layer eyas has no code for, each named with the field that says so."""
    parts = []
    mt = cfg.get("model_type")
    if cfg.get("kv_lora_rank") is not None:
        parts.append(f"multi-head latent attention (kv_lora_rank {show(cfg['kv_lora_rank'])})")
    experts = next((cfg[k] for k in _EXPERT_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 1), None)
    arch = archs[0] if archs else ""
    if experts is not None:
        parts.append(f"mixture-of-experts MLP ({experts} experts)")
    elif isinstance(mt, str) and mt.endswith("_moe") or "moe" in arch.lower():
        parts.append(f"mixture-of-experts MLP (model_type {mt!r})")
    if any(k in arch.lower() for k in ("nextn", "mtp")):
        parts.append(f"NextN/MTP layer ({arch})")
    if parallel_drafter(arch):
        parts.append(f"parallel drafting (P-EAGLE, {arch})")
    return parts


def draft_layer(cfg: dict[str, Any], archs: tuple[str, ...], file: str, where: str) -> DraftLayer:
    """The draft layer of the config dict `cfg` (the top level, or transformer_layer_config at `where`)."""
    mt = cfg.get("model_type")
    dense = _dense_class(archs)
    if dense is None:
        parts = _unrunnable_parts(cfg, archs)
        if parts:
            name = mt if isinstance(mt, str) else (archs[0] if archs else "unknown")
            via = f"architectures {list(archs)}" if archs else f"{where}model_type"
            return DraftLayer(name, f"{file}: {via} and the layer's fields", unsupported=" and ".join(parts))
    if mt in LAYER_TYPES:  # eyas writes a qwen3 layer's eagle config so; the weights decide (eyas.formats.read)
        return DraftLayer(mt, f"{file}: {where}model_type", class_layer=dense if dense not in (None, mt) else None)
    if dense is not None:
        return DraftLayer(dense, f"{file}: architectures {archs[0]}", unknown_model_type=mt)
    if mt is None:
        return DraftLayer("llama", f"assumed llama ({where}model_type absent)", assumed=True)
    return DraftLayer("llama", f"{file}: {where}model_type {mt!r} read as llama", unknown_model_type=mt)
