"""Exports of the shipped draft that eyas writes or meets, for the engine tests: each a folder.

Every variant starts from the shipped draft's weights; the config is eyas's own export
(`convert_checkpoint`) edited the way real exports differ. Names say what changed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eyas.drafter_loading import resolve_drafter
from eyas.formats import IDS, convert_checkpoint, read_checkpoint, write_checkpoint

SHIPPED = resolve_drafter(None)
OFF_BY_ONE = [1, 14, 26]  # the shipped draft's (2, 15, 27) in the output-of-layer convention


def _export(dst: Path, to: str) -> Path:
    convert_checkpoint(SHIPPED, dst, to)
    return dst


def _edit(d: Path, edit, name: str = "config.json") -> Path:
    cfg = json.loads((d / name).read_text())
    edit(cfg)
    (d / name).write_text(json.dumps(cfg, indent=2))
    return d


def config_json_disagrees(d: Path) -> Path:
    """(a) the seed's case: config.json (eagle, what engines read) records other capture layers than the
    weights were trained on; the correct speculators config sits beside it as config_speculators.json."""
    _export(d, "eagle")
    _export(d.with_name(d.name + "-spec"), "speculators")
    shutil.move(d.with_name(d.name + "-spec") / "config.json", d / "config_speculators.json")
    shutil.rmtree(d.with_name(d.name + "-spec"))

    def edit(cfg):
        cfg[IDS] = OFF_BY_ONE
        cfg["eagle_config"].pop(IDS)
    return _edit(d, edit)


def norm_before_residual_absent(d: Path) -> Path:
    """(b) a speculators config without norm_before_residual (vLLM's default there is True)."""
    return _edit(_export(d, "speculators"), lambda cfg: cfg.pop("norm_before_residual"))


def no_d2t(d: Path) -> Path:
    """(c) a reduced-vocab draft exported without d2t/t2d."""
    _export(d, "speculators")
    w = d / "model.safetensors"
    tensors = {k: v for k, v in load_file(w).items() if k not in ("d2t", "t2d")}
    save_file(tensors, w)
    return d


def nested_ids_output_convention(d: Path) -> Path:
    """(d) capture ids in the other convention: an eagle config whose only ids are the nested
    eagle_config ones, written output-of-layer (first id 1, as SGLang and SpecForge write them)."""
    return _edit(_export(d, "eagle"), lambda cfg: cfg.pop(IDS))


def eagle(d: Path) -> Path:
    """eyas's eagle export: top-level ids (capture indices) and nested ids (for SGLang)."""
    return _export(d, "eagle")


def speculators_no_ids(d: Path) -> Path:
    """A speculators config that names no layers."""
    return _edit(_export(d, "speculators"), lambda cfg: cfg.pop(IDS))


def eagle_norm_before_residual_absent(d: Path) -> Path:
    """An eagle config without norm_before_residual, top level or nested."""
    def edit(cfg):
        cfg.pop("norm_before_residual")
        cfg["eagle_config"].pop("norm_before_residual", None)
    return _edit(_export(d, "eagle"), edit)


def own_embeddings(noise: float):
    """A draft that ships its own embed_tokens: the target's plus `noise`."""
    def make(d: Path) -> Path:
        import torch

        from eyas.target import load_target_embeddings

        _export(d, "speculators")
        w = d / "model.safetensors"
        tensors = load_file(w)
        embed = load_target_embeddings(None).to(tensors["fc.weight"].dtype)
        jitter = torch.randn(embed.shape, generator=torch.Generator().manual_seed(0)).to(embed.dtype)
        tensors["embed_tokens.weight"] = embed + noise * jitter
        save_file(tensors, w)
        return d
    return make


def names_under_model_prefix(d: Path) -> Path:
    """A whole-model export: every name but lm_head's and the vocab map's under `model.` (vLLM refuses it)."""
    _export(d, "speculators")
    w = d / "model.safetensors"
    save_file({(n if n.startswith(("lm_head", "d2t", "t2d")) else "model." + n): t for n, t in load_file(w).items()}, w)
    return d


def unregistered_architecture(d: Path) -> Path:
    """An eagle config naming a class vLLM has not registered (SpecForge's QwQ config at 2ec57dd3 does)."""
    return _edit(_export(d, "eagle"), lambda cfg: cfg.update(architectures=["Qwen2ForCausalLMEagle3"]))


def specforge_aux_norm(d: Path) -> Path:
    """fc_norm in a SpecForge branch's spelling (ceefdebd): use_aux_norm and aux_norm_low/mid/high tensors."""
    def edit(cfg):
        cfg.pop("fc_norm", None)
        cfg["eagle_config"].pop("fc_norm", None)
        cfg["use_aux_norm"] = True
    _edit(_export(d, "eagle"), edit)
    w = d / "model.safetensors"
    tensors = load_file(w)
    width = tensors["fc.weight"].shape[1] // 3
    tensors.update({f"aux_norm_{k}.weight": tensors["norm.weight"].new_ones(width) for k in ("low", "mid", "high")})
    save_file(tensors, w)
    return d


def rope(scaling: dict):
    """eyas's eagle export with `scaling` as its rope_scaling (and rope_parameters, which transformers 5
    reads): the weights were trained on plain rope, so only whether both sides turn alike is measured."""
    def make(d: Path) -> Path:
        def edit(cfg):
            cfg["rope_scaling"] = scaling
            kind = {"rope_type": scaling.get("rope_type", scaling.get("type"))}
            cfg["rope_parameters"] = {**kind, **scaling, "rope_theta": cfg["rope_theta"]}
            cfg["rope_parameters"].pop("type", None)
        return _edit(_export(d, "eagle"), edit)
    return make


def shared_lm_head(fmt: str):
    """The shipped draft widened to the full vocab and stripped of its lm_head and vocab map: a draft
    trained on the target's frozen head, as SpecForge's --reuse-target-lm-head and speculators make them
    (here the head was trained, so acceptance falls; both sides use the target's head)."""
    def make(d: Path) -> Path:
        ckpt = read_checkpoint(SHIPPED)
        c = ckpt.contract
        c = c.replace(draft_vocab_size=c.vocab_size, has_vocab_map=False, has_lm_head=False)
        tensors = {k: v for k, v in ckpt.tensors.items() if k not in ("lm_head.weight", "d2t", "t2d")}
        return write_checkpoint(d, c, tensors, fmt)
    return make


def four_layers(fmt: str):
    """A fresh (random) draft reading four target states, as `fmt`."""
    def make(d: Path) -> Path:
        subprocess.run([sys.executable, "-m", "eyas", "init", str(d), "--capture-layers", "2,10,20,27", "--format",
                        fmt], check=True, capture_output=True)
        return d
    return make


def four_layers_without_count(d: Path) -> Path:
    """The four-state speculators draft as speculators writes it: no transformer_layer_config.
    num_aux_hidden_states, so vLLM 0.32 sizes fc for 3 (vLLM #54526)."""
    return _edit(four_layers("speculators")(d),
                 lambda cfg: cfg["transformer_layer_config"].pop("num_aux_hidden_states"))


def sliding_window(size: int):
    """The shipped draft's layer declared to attend over its last `size` positions, as the published
    speculators config of speculators issue 1065 declares 2048 (`layer_types` ["sliding_attention"])."""
    def make(d: Path) -> Path:
        def edit(cfg):
            cfg["transformer_layer_config"].update(layer_types=["sliding_attention"], sliding_window=size,
                                                   use_sliding_window=True)
        return _edit(_export(d, "speculators"), edit)
    return make


def qwen3_layer(architecture: str):
    """The shipped draft given a Qwen3 layer (q_norm/k_norm near 1, as speculators' qwen3 drafts carry them) in an
    eagle config naming `architecture`: vLLM's Qwen3 draft class loads it (eyas said vLLM refused any such), its
    Llama draft class does not."""
    def make(d: Path) -> Path:
        ckpt = read_checkpoint(SHIPPED)
        c = ckpt.contract.replace(layer_type="qwen3")
        g = torch.Generator().manual_seed(0)
        norms = {f"layers.0.self_attn.{n}.weight": (1 + 0.1 * torch.randn(c.head_dim, generator=g)).bfloat16()
                 for n in ("q_norm", "k_norm")}
        write_checkpoint(d, c, {**ckpt.tensors, **norms}, "eagle")
        return _edit(d, lambda cfg: cfg.update(architectures=[architecture]))
    return make


VARIANTS = {
    "healthy": None,  # the shipped folder itself
    "a_config_json_disagrees": config_json_disagrees,
    "b_norm_before_residual_absent": norm_before_residual_absent,
    "c_no_d2t": no_d2t,
    "d_nested_ids_output_convention": nested_ids_output_convention,
    "eagle": eagle,
    "speculators_no_ids": speculators_no_ids,
    "eagle_norm_before_residual_absent": eagle_norm_before_residual_absent,
    "own_embeddings": own_embeddings(0.01),
    "names_under_model_prefix": names_under_model_prefix,
    "unregistered_architecture": unregistered_architecture,
    "specforge_aux_norm": specforge_aux_norm,
    # Hunyuan's NTK-alpha, written as AngelSlim's hunyuan-1.8b config writes it (theirs: alpha 1000). Alpha
    # below 1 lowers the base (1e5 -> 860): over short answers a raised base barely moves the draft's tokens,
    # a lowered one does, so the engine drafting eyas's tokens shows it turns as eyas does
    "rope_ntk_alpha": rope({"type": "dynamic", "alpha": 0.01, "factor": 1.0}),
    "rope_dynamic_without_factor": rope({"type": "dynamic", "alpha": 1000.0}),  # transformers 5 refuses it
    "shared_lm_head": shared_lm_head("eagle"),
    "four_layers_speculators": four_layers("speculators"),
    "four_layers_speculators_without_count": four_layers_without_count,
    "four_layers_eagle": four_layers("eagle"),
    "sliding_window_4": sliding_window(4),  # every context served here is longer: the window cuts it
    "qwen3_layer_qwen3_class": qwen3_layer("Eagle3Qwen3ForCausalLM"),
    "qwen3_layer_llama_class": qwen3_layer("LlamaForCausalLMEagle3"),
    # the shipped (llama) layer under vLLM's Qwen3 class, as a user naming "the EAGLE-3 class for Qwen3" writes it
    "llama_layer_qwen3_class": lambda d: _edit(_export(d, "eagle"),
                                               lambda cfg: cfg.update(architectures=["Eagle3Qwen3ForCausalLM"])),
}


def build(root: Path) -> dict[str, Path]:
    """Every variant as a folder under `root`."""
    return {name: (make(root / name) if make else SHIPPED) for name, make in VARIANTS.items()}
