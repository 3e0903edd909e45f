"""Engine dumps: what an engine actually fed the draft, matched against the target's own states.

A dump (layout in docs/engine-dumps.md) holds `features[t]` for `input_ids[t]`. Each H-wide chunk
is matched against the target's states at every layer, raw or normed, at t-1, t and t+1
(`match_dump`); comparing the matches with what a correct engine feeds this draft names the
engine's fault (layers, order, norm, position, fc skipped).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eyas.contract import default_capture_layers
from eyas.data.values import check_ids
from eyas.doctor.capture import capture_tokens
from eyas.doctor.findings import make_finding
from eyas.doctor.hypotheses import block_fix, config_edits, config_records
from eyas.doctor.measure import Measurer, SkipFcDrafter
from eyas.doctor.stats import Outcome, beats, paired_test, rounded
from eyas.doctor.wiring import Wiring, contract_wiring
from eyas.drafter import Drafter
from eyas.errors import FormatError
from eyas.formats import Checkpoint
from eyas.target import Target
from eyas.target_ref import TargetRef

MATCH_COSINE = 0.95  # a dump chunk "is" a target state above this cosine and below this relative error
MATCH_REL_ERROR = 0.3
DUMP_ORDER = ("fc_skipped", "unmatched_features", "capture_layers", "concat_order", "normalized_features",
              "position_shift")

CACHE = "feature cache"  # a finding's source where a trainer's cache, not an engine, fed the features


def check_dump(dump: tuple[Tensor, Tensor], tgt: TargetRef | Target, path: str | Path) -> None:
    """A dump from another target or tokenizer cannot be matched: say so instead of matching noise."""
    ids, feats = dump
    check_ids(ids, tgt.vocab_size, file=path, key="input_ids",
              hint=f"dump with the tokenizer of {tgt.name}, or pass the --target the dump came from")
    if feats.shape[1] % tgt.hidden_size:
        raise FormatError(f"{path}: features are {feats.shape[1]} wide, not a multiple of the hidden size "
                          f"{tgt.hidden_size} of {tgt.name}", "dump the target the draft serves, or pass --target")


def _candidates(states: Tensor, m: Measurer) -> tuple[list[tuple[int, str]], Tensor]:
    """Every state a chunk may be: (layer, kind) names and the [C, T, H] stack of those states."""
    names, cands = [], []
    for k in range(states.shape[1]):
        for kind, f in (("raw", None), ("final_norm", m.final_norm),
                        ("input_norm", m.input_norms[k] if k < m.N else None)):
            if kind == "raw" or f is not None:
                names.append((k, kind))
                cands.append(states[:, k] if f is None else f(states[:, k]))
    return names, torch.stack(cands)


@torch.no_grad()
def match_dump(features: Tensor, sample: dict[str, Tensor], m: Measurer) -> list[dict[str, Any]]:
    """For each H-wide chunk of a dump's features, the target state it came from.

    Candidates: the residual stream at every index 0..N, each through the target's final norm (index
    N so is the final-normed state) and through layer k's input_layernorm (the normed input a hook on
    the attention sees), each at positions t-1, t and t+1. The best has the lowest median relative
    error |chunk - state| / |state| over positions 1..T-2 (where every shift exists); its mean cosine
    is reported beside it, and the runner-up from another layer or shift.
    """
    states = sample["states"]  # [T, N+1, H]
    T, H = states.shape[0], states.shape[-1]
    names, stack = _candidates(states, m)  # [C, T, H]
    out = []
    for i in range(features.shape[1] // H):
        chunk = features[1:T - 1, i * H:(i + 1) * H]  # [T-2, H]
        scored = []
        for d in (-1, 0, 1):
            c = stack[:, 1 + d:T - 1 + d]  # [C, T-2, H]: the states of position t + d
            rel = ((chunk - c).norm(dim=-1) / c.norm(dim=-1).clamp_min(1e-12)).median(dim=-1).values
            cos = torch.nn.functional.cosine_similarity(chunk[None], c, dim=-1).mean(-1)
            scored += [(float(rel[j]), float(cos[j]), *names[j], d) for j in range(len(names))]
        scored.sort()
        rel, cos, k, kind, d = scored[0]
        rel2, cos2, k2, kind2, d2 = next(s for s in scored if (s[2], s[4]) != (k, d))
        out.append({"chunk": i, "layer": k, "state": kind, "shift": d, "rel_error": rounded(rel),
                    "cosine": rounded(cos), "identified": cos >= MATCH_COSINE and rel <= MATCH_REL_ERROR,
                    "runner_up": {"layer": k2, "state": kind2, "shift": d2, "rel_error": rounded(rel2),
                                  "cosine": rounded(cos2)}})
    return out


def chunk_text(m: dict[str, Any]) -> str:
    """One matched chunk, in words."""
    kind = {"raw": "", "final_norm": " through the final norm", "input_norm": " through its input_layernorm"}
    at = "t" if m["shift"] == 0 else f"t{m['shift']:+d}"
    return (f"chunk {m['chunk']} = layer {m['layer']}{kind[m['state']]} at {at} (cosine {m['cosine']:.3f}, "
            f"relative error {m['rel_error']:.3f})")


def _layers_fix(got: list[int], want: tuple[int, ...], N: int, ckpt: Checkpoint) -> str:
    ids = _ids_edit(ckpt, want)
    if got == [k + 1 for k in want]:
        return ("the engine added 1 to the draft's layer ids (SGLang before PR #25454 reads eagle_config ids as "
                f"output-of-layer): {ids}, or upgrade SGLang" if ids else
                "the engine added 1 to the layer ids the draft's configs record rightly (as SGLang before PR "
                "#25454 did to eagle_config ids): upgrade the engine; the configs need no edit")
    if tuple(got) == default_capture_layers(N):
        return ("the engine did not read the draft's layer ids and fell back to (2, N//2, N-3) (vLLM 0.32 reads the "
                "top-level ids, else the nested eagle_config ids; llama.cpp only the top-level ones): "
                + (f"{ids} (eyas convert DIR OUT --format both)" if ids else
                   "the configs record them where those engines read them: check the engine's version and the "
                   "folder it was given"))
    if got == [k - 1 for k in want]:
        return ("the engine captured one layer early (the output of layer k instead of its input, or ids read as "
                f"capture indices where they meant output-of-layer): make it capture {list(want)}")
    return f"make the engine capture layers {list(want)}" + (f" (the draft's ids: {ids})" if ids else
                                                              " (the draft's configs record them rightly)")


def _ids_edit(ckpt: Checkpoint, want: tuple[int, ...]) -> str:
    """The config edit that records the draft's layer ids, or "" where every config records them already
    (the engine, not the config, is at fault: the edit would restate them)."""
    return "" if config_records(ckpt, "layers", want) else config_edits(ckpt, "layers", want)


def _recapture(want: tuple[int, ...], why: str = "") -> str:
    """How a feature cache is taken again at the draft's capture layers, by each trainer."""
    return (f"capture the cache again at capture layers {list(want)}{why} (eyas capture --capture-layers "
            f"{','.join(map(str, want))}; SpecForge takes them from the draft config it is given, speculators from "
            "--target-layer-ids)")


def _cache_layers_fix(got: list[int], want: tuple[int, ...]) -> str:
    """A feature cache taken at other layers than the draft reads: capture it again, or train for it."""
    deeper = (" (one layer deeper everywhere: ids written as capture indices where the trainer reads outputs of "
              "layers, as SpecForge and SGLang do)") if got == [k + 1 for k in want] else ""
    return f"{_recapture(want, deeper)}, or train a draft that reads {got} on this cache"


def _width_findings(W: int, H: int, want: tuple[int, ...], ckpt: Checkpoint, finding,
                    source: str) -> list[dict[str, Any]]:
    """The engine fed another number of states than the draft reads: one state (fc skipped) or another count.
    A cache stores what its trainer captured: the config the draft has is not at fault, the cache is."""
    if source == CACHE:
        return [finding("capture_layers", f"the feature cache stores {W // H} state{'s' * (W != H)} per position "
                        f"({W} wide); the draft reads {len(want)} ({len(want) * H} wide)",
                        f"{_recapture(want)}, or train a draft that reads {W // H} states on this cache")]
    if W == H and len(want) > 1:
        return [finding("fc_skipped", f"the engine fed one {H}-wide state, not {len(want)} concatenated: fc was "
                        "skipped and the EAGLE-3 draft ran as EAGLE-1",
                        "serve it as EAGLE-3: SGLang --speculative-algorithm EAGLE3, vLLM speculative_config "
                        "method \"eagle3\" (under EAGLE only the last hidden state is passed: sglang #21272)")]
    ids = _ids_edit(ckpt, want)
    return [finding("capture_layers", f"the engine fed {W // H} states ({W} wide); the draft reads "
                    f"{len(want)} ({len(want) * H} wide)",
                    f"make the engine capture layers {list(want)}" + (f": {ids}" if ids else ""))]


def dump_findings(matches: list[dict[str, Any]], W: int, m: Measurer, before: Outcome | None,
                  after: Outcome, ckpt: Checkpoint, source: str, fit: tuple[int, ...]) -> list[dict[str, Any]]:
    """What the engine got wrong, by comparing each chunk with what a correct engine feeds this draft:
    the raw residual stream at the layers its contract names (what an engine reads from the config;
    where the weights fit other layers, the measured finding says so), in order, at the same position.
    `source`: what the features came from ("engine dump", or "feature cache": a trainer's engine
    captured them). `fit`: the layers the draft's weights were measured to fit: a cache holding those
    is what the draft was trained on, and the measured finding's config edit is the fix, not a new
    capture."""
    H, want = m.H, contract_wiring(m.contract, m.ckpt.tensors, m.N).layers
    seen = "; ".join(chunk_text(c) for c in matches)

    def finding(slug: str, title: str, fix: str) -> dict[str, Any]:
        return make_finding(slug, title, f"{source}: {seen}", fix, before, after, source)

    if W != len(want) * H:
        return _width_findings(W, H, want, ckpt, finding, source)
    ok, out, got = [c for c in matches if c["identified"]], [], [c["layer"] for c in matches]
    lost = [c["chunk"] for c in matches if not c["identified"]]
    if lost and before is not None and beats(paired_test(before, after), 1):
        fed = "the cache holds" if source == CACHE else "the engine fed"
        which = "features" if len(lost) == len(matches) else f"chunk{'s' * (len(lost) > 1)} {lost} of features"
        out.append(finding("unmatched_features", f"{fed} {which} that are none of the target's states, and the "
                           f"draft does worse on them than on the layers it reads {list(want)}",
                           "pass the --target they came from (another model's features, or tokens not aligned "
                           "with them, match nothing); else the capture reads something other than the residual "
                           "stream: see docs/engine-dumps.md"))
    if len(ok) == len(matches) and got != list(want):
        if sorted(got) == sorted(want):
            out.append(finding("concat_order", f"the engine concatenated layers {got}; the draft reads {list(want)}",
                               "concatenate in the draft's order (engines append in layer order; a custom capture "
                               f"must too), or {block_fix(tuple(got), want, H, m.contract)}"))
        elif source != CACHE:
            out.append(finding("capture_layers", f"the engine captured layers {got}; the draft reads {list(want)}",
                               _layers_fix(got, want, m.N, ckpt)))
        elif got != list(fit):  # (a cache at the layers the weights fit is what they were trained on: the measured
            # finding's config edit is the fix)
            out.append(finding("capture_layers", f"the cache holds layers {got}; the draft reads {list(want)}",
                               _cache_layers_fix(got, want)))
    normed = [c for c in ok if c["state"] != "raw"]
    if normed:
        out.append(finding("normalized_features", f"the engine fed normed states ({chunk_text(normed[0])}); the "
                           "draft reads the raw residual stream",
                           "capture hidden_states + residual before any norm (in fused add-norm layers the normed "
                           "output is not the residual stream)"))
    shifted = [c for c in ok if c["shift"]]
    if shifted:
        d = shifted[0]["shift"]
        side = "before" if d < 0 else "after"
        out.append(finding("position_shift", f"features[t] are the target's states at t{d:+d}, not at t",
                           f"the engine pairs each token with the features of the position {side} it: features[t] "
                           "must be the state at input_ids[t] (check its hidden-state bookkeeping after accepted "
                           "tokens)"))
    return out


def _dump_outcome(m: Measurer, final: Wiring, fed: list[Tensor]) -> Outcome | None:
    """The draft on what the engine fed it (`fed[i]` for the measurer's sample i, against its greedy
    tokens, computed once): fc skipped when only one hidden-size state came (as SGLang does), None
    when nothing can run on that width."""
    W, c = fed[0].shape[1], m.contract
    if W == len(final.layers) * c.target_hidden_size:
        cls = Drafter
    elif W == c.hidden_size:
        cls = SkipFcDrafter
    else:
        return None
    samples = [{**s, "features": f} for s, f in zip(m.cap.samples, fed, strict=True)]
    return m.run(m.drafter(final, cls), samples, m.greedy)


def dump_section(m: Measurer, final: Wiring, features: Tensor, path: Path, ckpt: Checkpoint,
                 fed: list[Tensor] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """The engine dump matched against the target's states: (findings, report section, notes).

    `features` are matched against the first sample's states; the draft's acceptance on what was fed
    and on correct features is measured over the same samples, all of the measurer's: `fed` holds one
    tensor per sample (a feature cache's own), or is `[features]` by default (an engine dump, whose
    measurer holds its one sequence)."""
    sample = m.cap.samples[0]
    matches = match_dump(features, sample, m)
    source = "engine dump" if fed is None else CACHE
    fed = fed or [features]
    on_dump, correct = _dump_outcome(m, final, fed), m.measure(final)
    findings = dump_findings(matches, features.shape[1], m, on_dump, correct, ckpt, source, final.layers)
    lost = [c for c in matches if not c["identified"]]
    notes = ["dump chunks matching no target state: " + "; ".join(chunk_text(c) for c in lost)
             + " (another target or precision, or tokens not aligned with features)"] if lost else []
    section = {"path": str(path), "positions": int(features.shape[0]), "width": int(features.shape[1]),
               "chunks": matches, "samples_measured": len(fed),
               "acceptance_on_dump": None if on_dump is None else on_dump.summary(),
               "acceptance_on_correct_features": correct.summary()}
    return sorted(findings, key=lambda f: DUMP_ORDER.index(f["fault"])), section, notes


def dump_on_tokens(ckpt: Checkpoint, target: Target, dump: tuple[Tensor, Tensor], path: Path, final: Wiring
                   ) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """`dump_section` for an engine dump: the target's states over the dump's own tokens (one forward),
    the draft wired as `final` (the wiring its weights fit, or the contract's)."""
    source = f"the {dump[0].shape[0]} tokens of engine dump {path}"
    return dump_section(Measurer(ckpt, capture_tokens(target, dump[0], source)), final, dump[1], path, ckpt)
