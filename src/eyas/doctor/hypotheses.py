"""The catalogue of faults: every alternative wiring worth measuring, each with the fix it implies.

Each hypothesis is one fault real exporters or engines commit (capture layers off by one, another
concatenation order, normed features, a norm flag flipped, the target's embeddings, another vocab
map or rope theta, features one position late), written as the wiring the weights would then fit
and the config or tensor edit that makes that wiring the contract.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import Any

import torch

from eyas.contract import DEFAULT_ROPE_THETA, DraftContract, default_capture_layers
from eyas.doctor.measure import Measurer
from eyas.doctor.wiring import Wiring, stored_ids
from eyas.formats import IDS, NORM_FLAGS, Checkpoint, sglang_layer_ids


@dataclass
class Hypothesis:
    """An alternative wiring, the fault it stands for, and the change that would make it the contract."""

    slug: str
    name: str  # short label for the table
    wiring: Wiring
    fix: str
    trained_for: str  # what the weights fit, in words


def _edit_keys(ckpt: Checkpoint, name: str, fmt: str, what: str, value: Any) -> dict[str, Any]:
    """The keys (dotted) of config file `name` that record `value` for `what`, and their values."""
    if what == "layers":
        return {IDS: list(value)} | ({f"eagle_config.{IDS}": sglang_layer_ids(value)} if fmt == "eagle" else {})
    if what == "rope_theta":  # rope_parameters.rope_theta too, where the file has one (transformers 5 reads it)
        at = "transformer_layer_config." if fmt == "speculators" else ""
        layer = (ckpt.configs[name].get("transformer_layer_config") or {}) if at else ckpt.configs[name]
        has = isinstance(layer.get("rope_parameters"), dict) and "rope_theta" in layer["rope_parameters"]
        return {f"{at}rope_theta": value} | ({f"{at}rope_parameters.rope_theta": value} if has else {})
    if what == "rope_scaling":  # plain rope: no scaling under either name transformers reads
        at = "transformer_layer_config." if fmt == "speculators" else ""
        return {f"{at}rope_scaling": None, f"{at}rope_parameters.rope_type": "default"}
    return {what: value} | ({f"eagle_config.{what}": value} if fmt == "eagle" else {})  # a norm flag


def config_edits(ckpt: Checkpoint, what: str, value: Any) -> str:
    """The config edit, per config file of the folder, that records `value` for `what`."""
    edits = [f"in {name} set " + " and ".join(f"{k} = {json.dumps(v)}" for k, v in
                                             _edit_keys(ckpt, name, fmt, what, value).items())
             for name, fmt in ckpt.files.items()]
    if what == "layers" and value[0] == 1 and "eagle" in ckpt.files.values():
        edits.append("SGLang adds 1 to eagle_config ids that start at 1: it cannot capture these layers")
    return "; ".join(edits)


def config_records(ckpt: Checkpoint, what: str, value: Any) -> bool:
    """Whether every config file already records `value` for `what` (config_edits would change nothing)."""
    def at(config: Any, key: str) -> Any:
        for part in key.split("."):
            config = config.get(part) if isinstance(config, dict) else None
        return config

    return all(at(ckpt.configs[name], k) == v for name, fmt in ckpt.files.items()
               for k, v in _edit_keys(ckpt, name, fmt, what, value).items())


def layers_hypothesis(base: Wiring, ckpt: Checkpoint, name: str, layers: tuple[int, ...]) -> Hypothesis:
    """The weights fit capture layers `layers`: record them in every config file."""
    fix = f"record the layers the draft was trained on: {config_edits(ckpt, 'layers', layers)}"
    return Hypothesis("capture_layers", name, dataclasses.replace(base, layers=layers), fix,
                      f"capture layers {list(layers)}")


def layer_moves(layers: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """The capture layers next to `layers`: all ids moved together by -2..+2 (a convention fault
    moves every layer), then each id alone by -1 or +1."""
    joint = [(f"capture layers {d:+d}", tuple(k + d for k in layers)) for d in (-1, 1, -2, 2)]
    single = [(f"layer {layers[i]} {d:+d}", layers[:i] + (layers[i] + d,) + layers[i + 1:])
              for i, d in itertools.product(range(len(layers)), (-1, 1))]
    return joint + single


def _orders(layers: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every other concatenation order (reversal and rotations only beyond 4 chunks)."""
    if len(layers) <= 4:
        return [p for p in itertools.permutations(layers) if p != layers]
    rotations = [layers[i:] + layers[:i] for i in range(1, len(layers))]
    return [layers[::-1], *rotations]


def block_fix(trained: tuple[int, ...], served: tuple[int, ...], H: int, c: DraftContract) -> str:
    """Permute fc's column blocks so that block i reads served[i] (engines concatenate in layer order)."""
    take = [trained.index(k) for k in served]  # new block i = current block take[i]
    also = " (the same permutation for input_norm.weight's blocks)" if c.norm_before_fc else \
        " (and fc_norm.{i}.weight likewise)" if c.fc_norm else ""
    return (f"permute fc.weight's column blocks of width {H}: new block i = current block {take}[i], i.e. "
            f"fc.weight = cat([W[:, j*{H}:(j+1)*{H}] for j in {take}], dim=1){also}; then block i reads layer "
            f"{list(served)}[i] as engines concatenate")


def _layer_hypotheses(base: Wiring, m: Measurer, conventions: dict[str, tuple[int, ...]]) -> list[Hypothesis]:
    """Other readings of nested eagle_config ids, the layers next to the current ones, the engine default."""
    out = []
    for conv, layers in conventions.items():
        h = layers_hypothesis(base, m.ckpt, f"eagle_config ids read as {conv}", layers)
        out.append(dataclasses.replace(h, fix=f"{h.fix} (or read it with --layer-convention {conv})"))
    out += [layers_hypothesis(base, m.ckpt, name, layers) for name, layers in layer_moves(base.layers)]
    out.append(layers_hypothesis(base, m.ckpt, "engine default (2, N//2, N-3)", default_capture_layers(m.N)))
    out += [Hypothesis("concat_order", f"order {list(order)}", dataclasses.replace(base, layers=order),
                       block_fix(order, base.layers, m.H, m.contract), f"features concatenated as {list(order)}")
            for order in _orders(base.layers)]
    return out


def _normed_hypotheses(base: Wiring, N: int) -> list[Hypothesis]:
    """Features taken after the target's final norm: all of them, or (transformers 5) the layer-N chunk."""
    if base.normed != "none":
        return []
    exact = "" if base.norm_before_fc or base.fc_norm else (
        "; exact equivalent: set fc_norm = true and store fc_norm.{i}.weight = the target's model.norm.weight "
        "for every chunk (EAGLE-3.1 layout: vLLM PR #46488, SGLang PR #24663)")
    out = [Hypothesis("normalized_features", "final-normed features", dataclasses.replace(base, normed="all"),
                      "the draft was trained on target states after the final norm; engines feed the raw residual "
                      f"stream: retrain on raw states (eyas capture records them){exact}", "final-normed features")]
    if N in base.layers:  # transformers 5's output_hidden_states[N] is the final-normed state, not index N
        out.append(Hypothesis(
            "normalized_features", f"layer-{N} chunk final-normed", dataclasses.replace(base, normed="last"),
            f"the draft was trained with its layer-{N} chunk through the final norm (transformers 5's "
            "output_hidden_states[N]); engines feed it raw: retrain on raw states (eyas capture records them)",
            f"the layer-{N} chunk final-normed"))
    return out


def _flag_hypotheses(base: Wiring, ckpt: Checkpoint) -> list[Hypothesis]:
    """Each norm flag flipped (at most one feature norm on: norm_before_fc and fc_norm exclude each other)."""
    out = []
    for flag in NORM_FLAGS:
        v = not getattr(base, flag)
        changes = {flag: v}
        if v and flag in ("norm_before_fc", "fc_norm"):
            changes["fc_norm" if flag == "norm_before_fc" else "norm_before_fc"] = False
        untrained = {"norm_before_fc": "input_norm.weight", "fc_norm": "fc_norm.{i}.weight"}.get(flag) if v else None
        missing = f" (and store {untrained} = ones: the checkpoint has none)" if untrained and not any(
            n.startswith(untrained.split("{")[0]) for n in ckpt.tensors) else ""
        said = f"{flag} = {str(v).lower()}"
        out.append(Hypothesis("norm_flags", said, dataclasses.replace(base, **changes),
                              config_edits(ckpt, flag, v) + missing, said))
    return out


def _vocab_hypotheses(base: Wiring, m: Measurer) -> list[Hypothesis]:
    """The target's embeddings instead of the draft's own; the identity or lm_head's vocab map instead of d2t."""
    c, ckpt, out = m.contract, m.ckpt, []
    if base.embeddings == "own" and c.hidden_size == m.H:
        out.append(Hypothesis(
            "embeddings", "the target's embeddings", dataclasses.replace(base, embeddings="target"),
            "delete embed_tokens.weight from the weights: the draft was trained with the target's (shared) "
            "embeddings; SGLang substitutes them already, vLLM and speculators use the stored ones",
            "the target's embeddings"))
    ids = stored_ids(ckpt.tensors, c)
    if base.vocab == "stored" and not torch.equal(ids, torch.arange(len(ids))):
        out.append(Hypothesis(
            "vocab_map", "identity d2t", dataclasses.replace(base, vocab="identity"),
            "the stored d2t does not match the weights: the draft ids are target ids 0..Vd-1; store d2t = zeros "
            "and t2d marking ids 0..Vd-1 (or drop both when draft_vocab_size == vocab_size)", "identity vocab map"))
    current = {"stored": ids, "identity": torch.arange(c.draft_vocab_size)}.get(base.vocab)
    suspect = current is not None and c.reduced_vocab and "lm_head.weight" in ckpt.tensors and (
        base.vocab == "identity" or m.map_disagrees(current))  # no map stored, or lm_head points elsewhere
    if suspect and m.recovered() is not None and not torch.equal(current, m.recovered()):
        out.append(Hypothesis(
            "vocab_map", "d2t recovered from lm_head", dataclasses.replace(base, vocab="recovered"),
            "store the draft's real vocab map: d2t/t2d from its training run (d2t[i] = target_id[i] - i); the map "
            "read off lm_head (each draft row's nearest target row) is what was measured",
            "the vocab map that lm_head's rows point at"))
    return out


def _rope_and_shift_hypotheses(base: Wiring, m: Measurer) -> list[Hypothesis]:
    """The target's or the engines' default rope theta; plain rope where the config scales it (a
    trainer that ignores the scaling, as AngelSlim's does Hunyuan's alpha); features one position late."""
    out = []
    if base.rope_scaled:
        out.append(Hypothesis("rope", "plain rope (no rope_scaling)", dataclasses.replace(base, rope_scaled=False),
                              "the draft was trained on plain rope (its trainer ignored rope_scaling): "
                              + config_edits(m.ckpt, "rope_scaling", None), f"rope theta {base.rope_theta:g}"))
    for theta, whose in {m.target_theta: "the target's", DEFAULT_ROPE_THETA: "the engines' default"}.items():
        if theta is not None and theta != base.rope_theta:
            out.append(Hypothesis("rope", f"rope theta {theta:g} ({whose})",
                                  dataclasses.replace(base, rope_theta=theta),
                                  config_edits(m.ckpt, "rope_theta", theta), f"rope theta {theta:g}"))
    if base.shift == 0:
        out.append(Hypothesis(
            "position_shift", "features one position late", dataclasses.replace(base, shift=-1),
            "the draft was trained pairing features g_t with token x_{t+2} (a label shift applied twice, as in "
            "SpecForge PR #308): no serving flag fixes it; retrain with a single shift (eyas train)",
            "features one position late (g_{t-1} with x_{t+1})"))
    return out


def hypotheses(base: Wiring, m: Measurer, conventions: dict[str, tuple[int, ...]]) -> list[Hypothesis]:
    """Every alternative wiring worth measuring against `base`, one fault each; the first of equal
    wirings is kept (so the most specific explanation names it), wirings the target cannot feed are
    dropped, and so are wirings of another layer count (the engine default's three, for a draft whose fc
    reads two or four: fc cannot run on them)."""
    out = (_layer_hypotheses(base, m, conventions) + _normed_hypotheses(base, m.N) + _flag_hypotheses(base, m.ckpt)
           + _vocab_hypotheses(base, m) + _rope_and_shift_hypotheses(base, m))
    seen, unique = {base}, []
    for h in out:
        layers = h.wiring.layers
        if h.wiring not in seen and len(layers) == len(base.layers) and all(0 <= k <= m.N for k in layers):
            seen.add(h.wiring)
            unique.append(h)
    return unique
