"""`eyas doctor`: why a draft gets low acceptance, named as a wiring fault, with numbers and a fix.

A draft is only as good as its wiring: which target states feed it, in which order, normed or not,
at which position, with which norm flags, embeddings, vocab map and rope. Exporters and engines get
each of these wrong in known ways, and every one fails silently: the draft still drafts, acceptance
just drops (reference docs: eagle-specforge-sglang §0 fact 10, §4.4; speculators-and-vllm §4.4-4.7,
§5). `diagnose` looks three ways:

1. Static: everything `eyas check` finds, plus where vLLM, SGLang and speculators would wire the
   checkpoint differently from its contract (`eyas.check.consumers`), each with the fix.
2. Measured: the target answers a few prompts ONCE, and one forward records the residual stream at
   every index 0..N plus the final-normed state (`collect`). Every alternative wiring (capture layers
   off by one, another order, normed features, a norm flag flipped, the target's embeddings, another
   vocab map or rope theta, features one position late, another config file's contract, what each
   engine would do) is then a slice, permutation, norm or shift of those tensors, or a change to the
   drafter, scored on the same positions. A hypothesis is reported only when it beats the current
   wiring significantly (`paired_test`, `beats`); the best one is adopted and the rest are re-tested
   against it, so a second fault hiding behind the first is found too.
3. Engine dumps: what an engine actually fed the draft (`features[t]` for `input_ids[t]`, layout in
   docs/engine-dumps.md) is matched chunk by chunk against the target's states at every layer,
   normed or not, at t-1, t and t+1 (`match_dump`).

Nothing here prints except progress on stderr; `diagnose` returns a JSON-ready dict and
`format_report` renders it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eyas.check import check_checkpoint, consumers
from eyas.contract import DEFAULT_ROPE_THETA, DraftContract, default_capture_layers, expected_shapes
from eyas.data import capture, open_shards, read_prompts
from eyas.drafter import Drafter, RMSNorm
from eyas.errors import ContractError, EyasError, FormatError
from eyas.evaluate import chain_acceptance, sample_predictions, target_greedy
from eyas.formats import IDS, NORM_FLAGS, Checkpoint, read_checkpoint, sglang_layer_ids, target_facts
from eyas.target import Target, resolve_target, target_config

SLUGS = ("capture_layers", "concat_order", "normalized_features", "fc_skipped", "embeddings", "vocab_map",
         "rope", "norm_flags", "config_file", "position_shift")
DEPTH = 5  # chains of k = 5 draft tokens: depth-1 acceptance and tau(5)
ALPHA = 0.01  # family-wise error rate: p * (number of tests in the round) must stay below it
MIN_GAIN_DEPTH1 = 0.05  # a significant change must also matter: +5 points of depth-1 acceptance,
MIN_GAIN_ACCEPTED = 0.1  # or +0.1 accepted tokens per chain of 5
MAX_ROUNDS = 3  # adopt the best hypothesis, re-test the rest; at most this many faults in a row
DEFAULT_PROMPTS = "mtbench"
# 8 MT-bench prompts x 64 tokens = ~500 measured positions. On SmolLM2-135M (30 layers) with an 8k-vocab
# draft, a run that finds nothing took 91 s on the shared 2-core machine (capture 20 s, 22 wirings at ~3 s);
# each further round (a fault found) adds about one minute.
DEFAULT_LIMIT = 8  # prompts
DEFAULT_MAX_NEW_TOKENS = 64
MATCH_COSINE = 0.95  # a dump chunk "is" a target state above this cosine and below this relative error
MATCH_REL_ERROR = 0.3


# --- capture once -------------------------------------------------------------------------------


@dataclass
class Capture:
    """The target's states for some token sequences, recorded once and sliced for every hypothesis.

    Each sample: `input_ids` [T], `loss_mask` [T] (the positions measured), `states` [T, N+1, H]
    (index k = the residual stream entering decoder layer k, index N = the last layer's output
    before the final norm) and `last_hidden` [T, H] (final-normed, what lm_head reads).
    """

    target: Target
    samples: list[dict[str, Tensor]]
    source: str  # what the sequences are, for the report
    seconds: float

    @property
    def positions(self) -> int:
        """Chain starts measured, counted as `eyas.evaluate.sample_predictions` does: the draft reads
        x_{t+1} and its first label is x_{t+2}, both answer tokens."""
        return sum(int((m[1:-1] & m[2:]).sum()) for m in (s["loss_mask"] for s in self.samples))


def collect(target: Target | str | Path | None = None, prompts: str | Path | None = None, *,
            limit: int = DEFAULT_LIMIT, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
            progress: bool = True) -> Capture:
    """Greedy answers to `limit` prompts (default: MT-bench) and every state of the target on them.

    One `eyas.data.capture` at ALL indices 0..N (fp32, in a temporary folder): generation and the
    forward pass are what eyas capture does, so the features are exactly those a draft trained with
    eyas saw.
    """
    t0 = time.perf_counter()
    tgt = target if isinstance(target, Target) else Target.load(target, dtype=torch.float32)
    found = read_prompts(prompts or DEFAULT_PROMPTS, limit=limit)
    N, H = tgt.num_layers, tgt.hidden_size
    with tempfile.TemporaryDirectory(prefix="eyas-doctor-") as tmp:
        capture(tgt, found, range(N + 1), tmp, max_new_tokens=max_new_tokens, dtype=torch.float32,
                progress=progress)
        samples = [{"input_ids": s["input_ids"], "loss_mask": s["loss_mask"], "last_hidden": s["last_hidden"],
                    "states": s["features"].view(-1, N + 1, H)}  # [T, (N+1)*H] -> [T, N+1, H]
                   for s in open_shards(tmp)]
    source = f"{len(samples)} prompts ({prompts or DEFAULT_PROMPTS}) x {max_new_tokens} greedy tokens"
    return Capture(tgt, samples, source, time.perf_counter() - t0)


def _capture_tokens(tgt: Target, input_ids: Tensor, source: str) -> Capture:
    """Every state of the target on one given token sequence (an engine dump's); all positions measured."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = tgt.forward(input_ids[None], range(tgt.num_layers + 1), with_logits=False)
    T = input_ids.shape[0]
    sample = {"input_ids": input_ids, "loss_mask": torch.ones(T, dtype=torch.bool), "last_hidden": out.last_hidden[0],
              "states": out.features[0].view(T, tgt.num_layers + 1, tgt.hidden_size)}
    return Capture(tgt, [sample], source, time.perf_counter() - t0)


# --- wirings and their measurement --------------------------------------------------------------


@dataclass(frozen=True)
class Wiring:
    """One way of running the draft: the features it is fed and the settings it runs with."""

    layers: tuple[int, ...]  # capture indices, in concatenation order
    normed: str  # "none"; "all": every chunk through the target's final norm; "last": the deepest chunk only
    shift: int  # position t is fed the states of position t + shift
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    embeddings: str  # "own" (the checkpoint's embed_tokens) or "target"
    vocab: str  # "stored" d2t, "identity", "recovered" (from lm_head rows), or "none" (full vocab, no map)
    rope_theta: float

    def drafter_key(self) -> tuple:
        return (self.norm_before_residual, self.norm_before_fc, self.fc_norm, self.norm_output, self.embeddings,
                self.vocab, self.rope_theta)

    def describe(self) -> str:
        flags = [f for f in NORM_FLAGS if getattr(self, f)]
        parts = [f"capture layers {list(self.layers)}", "final-normed features" if self.normed == "all" else
                 "deepest chunk final-normed" if self.normed == "last" else "raw residual stream"]
        if self.shift:
            parts.append(f"features of position t{self.shift:+d}")
        parts += [f"norm flags {flags or 'none'}", "own embeddings" if self.embeddings == "own" else
                  "the target's embeddings", f"rope theta {self.rope_theta:g}"]
        if self.vocab != "none":
            parts.append(f"{self.vocab} d2t")
        return ", ".join(parts)


@dataclass
class Outcome:
    """Per-position results of one wiring: the same positions, in the same order, for every wiring."""

    first: Tensor  # [P] bool: the depth-1 draft token is the target's
    accepted: Tensor  # [P] int: draft tokens accepted in a greedy chain of DEPTH
    acceptance_by_depth: list[float]
    tau: float  # tau(k=DEPTH), eyas.evaluate's measuring stick
    error: str | None = None  # the wiring cannot run (e.g. a layer the target lacks): counted as all rejected

    @property
    def depth1(self) -> float:
        return float(self.first.float().mean()) if len(self.first) else float("nan")

    def summary(self) -> dict[str, Any]:
        out = {"acceptance_depth1": _round(self.depth1), "tau5": _round(self.tau),
               "acceptance_by_depth": [_round(a) for a in self.acceptance_by_depth]}
        return out | ({"error": self.error} if self.error else {})


def _round(x: float | None, n: int = 4) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), n)


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exact (Python integers)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def paired_test(base: Outcome, alt: Outcome) -> dict[str, Any]:
    """Does `alt` beat `base` on the same positions? Two exact one-sided sign tests.

    Depth 1 (exact McNemar): among positions where exactly one wiring's first draft token is right,
    `alt` wins b and loses c; p = P(X >= b), X ~ Bin(b + c, 1/2). Chains: the same test on the
    accepted length of a chain of DEPTH tokens (wins = longer), which also sees faults that act only
    from depth 2 on (norm_output).
    """
    b = int((alt.first & ~base.first).sum())
    c = int((base.first & ~alt.first).sum())
    wins, losses = int((alt.accepted > base.accepted).sum()), int((alt.accepted < base.accepted).sum())
    return {
        "positions": int(base.first.numel()),
        "depth1_wins_losses": [b, c],
        "p_depth1": binomial_tail(b, b + c),
        "chain_wins_losses": [wins, losses],
        "p_chain": binomial_tail(wins, wins + losses),
        "gain_depth1": alt.depth1 - base.depth1,
        "gain_accepted": float(alt.accepted.float().mean() - base.accepted.float().mean()),
    }


def beats(test: dict[str, Any], tests: int) -> bool:
    """Significant after Bonferroni over `tests` tests (p * tests < ALPHA) AND large enough to matter."""
    return (test["p_depth1"] * tests < ALPHA and test["gain_depth1"] >= MIN_GAIN_DEPTH1) or (
        test["p_chain"] * tests < ALPHA and test["gain_accepted"] >= MIN_GAIN_ACCEPTED)


class _SkipFc(Drafter):
    """A drafter fed one H-wide state with fc skipped: what SGLang does when an EAGLE-3 draft is run
    under --speculative-algorithm EAGLE (reference: eagle-specforge-sglang §4.4, sglang #21272)."""

    def combine(self, features: Tensor) -> Tensor:
        return features


class _Bench:
    """The draft, the target's states and a cache of outcomes per wiring."""

    def __init__(self, ckpt: Checkpoint, cap: Capture, progress: bool):
        self.ckpt, self.cap, self.progress = ckpt, cap, progress
        self.contract = ckpt.contract
        tgt = cap.target
        self.N, self.H = tgt.num_layers, tgt.hidden_size
        self.lm_head = tgt.model.get_output_embeddings().weight.detach().float()  # [V, H]
        self._greedy: list[Tensor] | None = None  # see `greedy`
        self.embed = tgt.model.get_input_embeddings().weight.detach().float()  # [V, H]
        decoder = tgt.model.base_model
        eps = getattr(tgt.config, "rms_norm_eps", 1e-6)
        self.final_norm = _norm(decoder.norm.weight, eps)
        self.input_norms = [_norm(layer.input_layernorm.weight, eps) for layer in decoder.layers]
        self._recovered: Tensor | None | bool = False  # False: not computed yet
        self.target_theta = target_facts(tgt.config.to_dict())["rope_theta"]
        self._drafters: dict[tuple, Drafter] = {}
        self._outcomes: dict[Wiring, Outcome] = {}

    # -- the draft side --
    def drafter(self, w: Wiring, cls: type[Drafter] = Drafter) -> Drafter:
        key = (cls, *w.drafter_key())
        if key not in self._drafters:
            c, t = self._tensors(w)
            embed = None if c.has_embeddings else self.embed
            self._drafters[key] = cls.from_tensors(c, t, embed_tokens=embed)
        return self._drafters[key]

    def _tensors(self, w: Wiring) -> tuple[DraftContract, dict[str, Tensor]]:
        """The contract and tensors that run wiring `w`: tensors the wiring does not use are dropped
        (as engines skip them), a norm it turns on without trained weights gets weight 1, and the vocab
        map is the stored, identity or recovered one."""
        c0 = self.contract
        c = c0.replace(norm_before_residual=w.norm_before_residual, norm_before_fc=w.norm_before_fc,
                       fc_norm=w.fc_norm, norm_output=w.norm_output, rope_theta=w.rope_theta,
                       has_embeddings=w.embeddings == "own", has_vocab_map=w.vocab != "none")
        src = self.ckpt.tensors
        out = {}
        for name, shape in expected_shapes(c).items():
            if name in ("d2t", "t2d"):
                continue
            if name in src and tuple(src[name].shape) == shape:
                out[name] = src[name]
            elif name == "input_norm.weight" or name.startswith("fc_norm."):
                out[name] = torch.ones(shape)
            else:
                raise ContractError(f"{name} is missing or misshapen; the draft cannot run", "run eyas check on it")
        if c.has_vocab_map:
            Vd, V = c.draft_vocab_size, c.vocab_size
            ids = {"stored": lambda: _stored_ids(src, c0), "identity": lambda: torch.arange(Vd),
                   "recovered": self.recovered}[w.vocab]()  # target id of each draft id
            out["d2t"] = (ids - torch.arange(Vd)).long()
            out["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, ids, True)
        return c, out

    # -- the feature side --
    def features(self, s: dict[str, Tensor], w: Wiring) -> Tensor:
        """[T, A*H] for wiring `w` out of the sample's recorded states: a slice, permutation, norm, shift."""
        T = s["states"].shape[0]
        at = (torch.arange(T) + w.shift).clamp(0, T - 1)  # position t reads the states of t + shift
        chunks = [s["states"][at, k] for k in w.layers]  # A x [T, H]
        if w.normed == "all":
            chunks = [self.final_norm(x) for x in chunks]
        elif w.normed == "last":
            i = w.layers.index(max(w.layers))
            chunks[i] = self.final_norm(chunks[i])
        return torch.cat(chunks, dim=-1)

    # -- scoring --
    def measure(self, w: Wiring) -> Outcome:
        if w not in self._outcomes:
            bad = [k for k in w.layers if not 0 <= k <= self.N]
            if bad:
                self._outcomes[w] = self._rejected(f"layers {bad} do not exist in a {self.N}-layer target")
            else:
                try:
                    drafter = self.drafter(w)
                except ContractError as e:  # e.g. a malformed stored d2t: engines would fail or misread it
                    self._outcomes[w] = self._rejected(str(e))
                    return self._outcomes[w]
                samples = [{**s, "features": self.features(s, w)} for s in self.cap.samples]
                self._outcomes[w] = self._run(drafter, samples, self.greedy)
        return self._outcomes[w]

    @property
    def greedy(self) -> list[Tensor]:
        """The target's greedy tokens per captured sample: they do not depend on the wiring, so the
        full-vocab matmul runs once, not once per hypothesis."""
        if self._greedy is None:
            self._greedy = [target_greedy(s, self.lm_head) for s in self.cap.samples]
        return self._greedy

    def _run(self, drafter: Drafter, samples: list[dict[str, Tensor]], greedy_tokens: list[Tensor]) -> Outcome:
        parts = []
        with torch.inference_mode():
            for s, greedy in zip(samples, greedy_tokens, strict=True):
                if int(s["loss_mask"].sum()) >= 2:
                    parts.append(sample_predictions(drafter, s, self.lm_head, DEPTH, 1, greedy=greedy))
        if not parts:
            raise EyasError("no positions to measure", "use prompts that the target answers (or a longer dump)")
        pred, truth, valid = (torch.cat([p[k] for p in parts]) for k in ("pred", "truth", "valid"))
        rep = chain_acceptance(pred, truth, valid)
        accepted = torch.cummin(((pred == truth) & valid).int(), dim=1).values.sum(1)  # [P]
        return Outcome(pred[:, 0] == truth[:, 0], accepted, rep["acceptance_by_depth"], rep["tau_chain"][str(DEPTH)])

    def recovered(self) -> Tensor | None:
        """The vocab map read off lm_head (`_recover_vocab_map`), computed once, when first asked for."""
        if self._recovered is False:
            self._recovered = _recover_vocab_map(self.ckpt.tensors.get("lm_head.weight"), self.lm_head, self.contract)
        return self._recovered

    def map_disagrees(self, ids: Tensor) -> bool:
        """Whether lm_head's rows point elsewhere than `ids` says, judged on 256 rows (a full check of
        a 32k draft vocab against a 128k target vocab would cost a full matmul)."""
        rows = torch.linspace(0, len(ids) - 1, min(256, len(ids))).long()
        c = self.contract.replace(draft_vocab_size=len(rows))
        sample = _recover_vocab_map(self.ckpt.tensors["lm_head.weight"][rows], self.lm_head, c)
        return sample is None or bool((sample != ids[rows]).float().mean() > 0.1)

    def _rejected(self, why: str) -> Outcome:
        P = self.cap.positions
        return Outcome(torch.zeros(P, dtype=torch.bool), torch.zeros(P, dtype=torch.long), [0.0] * DEPTH, 1.0, why)


def _norm(weight: Tensor, eps: float) -> RMSNorm:
    """An RMSNorm holding a copy of the target's weight (the drafter's norm, so one formula)."""
    norm = RMSNorm(weight.shape[0], eps)
    norm.weight = torch.nn.Parameter(weight.detach().float().clone(), requires_grad=False)
    return norm


def _recover_vocab_map(draft_head: Tensor | None, target_head: Tensor, c: DraftContract) -> Tensor | None:
    """Target id of each draft id, read off lm_head: each draft row's most similar target row.

    Drafts trained by eyas, speculators and SpecForge start lm_head as the target's rows of the draft
    vocab, and training moves them little; when every draft row points at a distinct target row with
    cosine > 0.5 the map is taken as recovered. None otherwise (or for a full-vocab draft).
    """
    if draft_head is None or not c.reduced_vocab or draft_head.shape[1] != target_head.shape[1]:
        return None
    a = torch.nn.functional.normalize(draft_head.float(), dim=-1)  # [Vd, H]
    b = torch.nn.functional.normalize(target_head.float(), dim=-1)  # [V, H]
    best = [(a[i:i + 4096] @ b.T).max(-1) for i in range(0, len(a), 4096)]  # in blocks: Vd x V can be large
    cos, ids = torch.cat([m.values for m in best]), torch.cat([m.indices for m in best])
    if ids.unique().numel() != len(ids) or float(cos.min()) <= 0.5:
        return None
    return ids


# --- hypotheses ---------------------------------------------------------------------------------


@dataclass
class Hypothesis:
    """An alternative wiring, the fault it stands for, and the change that would make it the contract."""

    slug: str
    name: str  # short label for the table
    wiring: Wiring
    fix: str
    trained_for: str  # what the weights fit, in words


def _stored_ids(tensors: dict[str, Tensor], c: DraftContract) -> Tensor | None:
    """Target id of each draft id as the checkpoint stores it (d2t offsets, else the t2d mask)."""
    if "d2t" in tensors and tuple(tensors["d2t"].shape) == (c.draft_vocab_size,):
        return torch.arange(c.draft_vocab_size) + tensors["d2t"].long()
    if "t2d" in tensors and int(tensors["t2d"].sum()) == c.draft_vocab_size:
        return tensors["t2d"].bool().nonzero().flatten()
    return None


def contract_wiring(c: DraftContract, tensors: dict[str, Tensor], num_layers: int) -> Wiring:
    """How the contract says the draft runs. No layer ids: the engines' default; a reduced vocab
    without d2t: the identity map, which is what vLLM and SGLang then use (silently)."""
    has_map = _stored_ids(tensors, c) is not None
    return Wiring(
        layers=tuple(c.capture_layers or default_capture_layers(num_layers)), normed="none", shift=0,
        norm_before_residual=c.norm_before_residual, norm_before_fc=c.norm_before_fc, fc_norm=c.fc_norm,
        norm_output=c.norm_output, embeddings="own" if c.has_embeddings else "target",
        vocab="stored" if has_map else "identity" if c.reduced_vocab else "none", rope_theta=c.rope_base,
    )


def _set(ckpt: Checkpoint, what: str, value: Any) -> str:
    """The config edit, per config file of the folder, that records `value` for `what`."""
    edits = []
    for name, fmt in ckpt.files.items():
        if what == "layers":
            keys = {IDS: list(value)} | ({f"eagle_config.{IDS}": sglang_layer_ids(value)} if fmt == "eagle" else {})
        elif what == "rope_theta":  # (rope_parameters.rope_theta too, where the file has one)
            keys = {"transformer_layer_config.rope_theta" if fmt == "speculators" else "rope_theta": value}
        else:  # a norm flag
            keys = {what: value} | ({f"eagle_config.{what}": value} if fmt == "eagle" else {})
        edits.append(f"in {name} set " + " and ".join(f"{k} = {json.dumps(v)}" for k, v in keys.items()))
    if what == "layers" and value[0] == 1 and "eagle" in ckpt.files.values():
        edits.append("SGLang adds 1 to eagle_config ids that start at 1: it cannot capture these layers")
    return "; ".join(edits)


def _orders(layers: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every other concatenation order (reversal and rotations only beyond 4 chunks)."""
    if len(layers) <= 4:
        return [p for p in itertools.permutations(layers) if p != layers]
    rotations = [layers[i:] + layers[:i] for i in range(1, len(layers))]
    return [layers[::-1], *rotations]


def _block_fix(trained: tuple[int, ...], served: tuple[int, ...], H: int, c: DraftContract) -> str:
    """Permute fc's column blocks so that block i reads served[i] (engines concatenate in layer order)."""
    take = [trained.index(k) for k in served]  # new block i = current block take[i]
    also = " (the same permutation for input_norm.weight's blocks)" if c.norm_before_fc else \
        " (and fc_norm.{i}.weight likewise)" if c.fc_norm else ""
    return (f"permute fc.weight's column blocks of width {H}: new block i = current block {take}[i], i.e. "
            f"fc.weight = cat([W[:, j*{H}:(j+1)*{H}] for j in {take}], dim=1){also}; then block i reads layer "
            f"{list(served)}[i] as engines concatenate")


def _hypotheses(base: Wiring, bench: _Bench, conventions: dict[str, tuple[int, ...]]) -> list[Hypothesis]:
    """Every alternative wiring worth measuring against `base`, one fault each; the first of equal
    wirings is kept (so the most specific explanation names it)."""
    N, L, c, ckpt, H = bench.N, base.layers, bench.contract, bench.ckpt, bench.H
    out: list[Hypothesis] = []

    def add(slug: str, name: str, fix: str, trained_for: str, **changes: Any) -> None:
        out.append(Hypothesis(slug, name, dataclasses.replace(base, **changes), fix, trained_for))

    def layers_fix(new: tuple[int, ...]) -> str:
        return f"record the layers the draft was trained on: {_set(ckpt, 'layers', new)}"

    for conv, layers in conventions.items():
        add("capture_layers", f"eagle_config ids read as {conv}", f"{layers_fix(layers)} (or read it with "
            f"--layer-convention {conv})", f"capture layers {list(layers)}", layers=layers)
    for d in (-1, 1):
        new = tuple(k + d for k in L)
        add("capture_layers", f"capture layers {d:+d}", layers_fix(new), f"capture layers {list(new)}", layers=new)
    for i, d in itertools.product(range(len(L)), (-1, 1)):
        new = L[:i] + (L[i] + d,) + L[i + 1:]
        add("capture_layers", f"layer {L[i]} {d:+d}", layers_fix(new), f"capture layers {list(new)}", layers=new)
    default = default_capture_layers(N)
    add("capture_layers", "engine default (2, N//2, N-3)", layers_fix(default), f"capture layers {list(default)}",
        layers=default)
    for order in _orders(L):
        add("concat_order", f"order {list(order)}", _block_fix(order, L, H, c),
            f"features concatenated as {list(order)}", layers=order)
    if base.normed == "none":
        exact = "" if base.norm_before_fc or base.fc_norm else (
            "; exact equivalent: set fc_norm = true and store fc_norm.{i}.weight = the target's model.norm.weight "
            "for every chunk (EAGLE-3.1 layout: vLLM PR #46488, SGLang PR #24663)")
        add("normalized_features", "final-normed features",
            "the draft was trained on target states after the final norm; engines feed the raw residual stream: "
            f"retrain on raw states (eyas capture records them){exact}", "final-normed features", normed="all")
        if N in L:  # transformers 5's output_hidden_states[N] is the final-normed state, not index N
            add("normalized_features", f"layer-{N} chunk final-normed",
                f"the draft was trained with its layer-{N} chunk through the final norm (transformers 5's "
                "output_hidden_states[N]); engines feed it raw: retrain on raw states (eyas capture records them)",
                f"the layer-{N} chunk final-normed", normed="last")
    for flag in NORM_FLAGS:
        v = not getattr(base, flag)
        changes = {flag: v}
        if v and flag in ("norm_before_fc", "fc_norm"):  # at most one feature norm
            changes["fc_norm" if flag == "norm_before_fc" else "norm_before_fc"] = False
        untrained = {"norm_before_fc": "input_norm.weight", "fc_norm": "fc_norm.{i}.weight"}.get(flag) if v else None
        missing = f" (and store {untrained} = ones: the checkpoint has none)" if untrained and not any(
            n.startswith(untrained.split("{")[0]) for n in ckpt.tensors) else ""
        add("norm_flags", f"{flag} = {str(v).lower()}", _set(ckpt, flag, v) + missing, f"{flag} = {str(v).lower()}",
            **changes)
    if base.embeddings == "own" and c.hidden_size == H:
        add("embeddings", "the target's embeddings",
            "delete embed_tokens.weight from the weights: the draft was trained with the target's (shared) "
            "embeddings; SGLang substitutes them already, vLLM and speculators use the stored ones",
            "the target's embeddings", embeddings="target")
    ids = _stored_ids(ckpt.tensors, c)
    if base.vocab == "stored" and not torch.equal(ids, torch.arange(len(ids))):
        add("vocab_map", "identity d2t",
            "the stored d2t does not match the weights: the draft ids are target ids 0..Vd-1; store d2t = zeros "
            "and t2d marking ids 0..Vd-1 (or drop both when draft_vocab_size == vocab_size)",
            "identity vocab map", vocab="identity")
    current = {"stored": ids, "identity": torch.arange(c.draft_vocab_size)}.get(base.vocab)
    suspect = current is not None and c.reduced_vocab and "lm_head.weight" in ckpt.tensors and (
        base.vocab == "identity" or bench.map_disagrees(current))  # no map stored, or lm_head points elsewhere
    if suspect and bench.recovered() is not None and not torch.equal(current, bench.recovered()):
        add("vocab_map", "d2t recovered from lm_head",
            "store the draft's real vocab map: d2t/t2d from its training run (d2t[i] = target_id[i] - i); the map "
            "read off lm_head (each draft row's nearest target row) is what was measured",
            "the vocab map that lm_head's rows point at", vocab="recovered")
    thetas = {bench.target_theta: "the target's", DEFAULT_ROPE_THETA: "the engines' default"}
    for theta, whose in thetas.items():
        if theta is not None and theta != base.rope_theta:
            add("rope", f"rope theta {theta:g} ({whose})", _set(ckpt, "rope_theta", theta), f"rope theta {theta:g}",
                rope_theta=theta)
    if base.shift == 0:
        add("position_shift", "features one position late",
            "the draft was trained pairing features g_t with token x_{t+2} (a label shift applied twice, as in "
            "SpecForge PR #308): no serving flag fixes it; retrain with a single shift (eyas train)",
            "features one position late (g_{t-1} with x_{t+1})", shift=-1)
    seen, unique = {base}, []
    for h in out:
        if h.wiring not in seen and all(0 <= k <= N for k in h.wiring.layers):
            seen.add(h.wiring)
            unique.append(h)
    return unique


# --- findings -----------------------------------------------------------------------------------


def _finding(slug: str, title: str, evidence: str, fix: str, before: Outcome | None, after: Outcome | None,
             source: str, **extra: Any) -> dict[str, Any]:
    assert slug in SLUGS, slug
    return {"fault": slug, "title": title, "evidence": evidence, "fix": fix,
            "acceptance_before": None if before is None else _round(before.depth1),
            "acceptance_after": None if after is None else _round(after.depth1),
            "tau_before": None if before is None else _round(before.tau),
            "tau_after": None if after is None else _round(after.tau), "source": source, **extra}


def _numbers(before: Outcome, after: Outcome, test: dict[str, Any], tests: int) -> str:
    b, c = test["depth1_wins_losses"]
    w, l = test["chain_wins_losses"]
    return (f"depth-1 acceptance {before.depth1:.3f} -> {after.depth1:.3f}, tau(5) {before.tau:.2f} -> "
            f"{after.tau:.2f} over {test['positions']} positions; exact McNemar p = {test['p_depth1']:.1e} "
            f"({b} positions gained, {c} lost), chain-length sign test p = {test['p_chain']:.1e} ({w}/{l}); "
            f"{tests} test{'s' * (tests != 1)} in the round, Bonferroni at {ALPHA}")


def _differs(a: Wiring, b: Wiring) -> str:
    """The slug of the first way two wirings differ (the fault that separates them)."""
    if a.layers != b.layers:
        return "concat_order" if sorted(a.layers) == sorted(b.layers) else "capture_layers"
    for field, slug in (("normed", "normalized_features"), ("shift", "position_shift"), ("embeddings", "embeddings"),
                        ("vocab", "vocab_map"), ("rope_theta", "rope")):
        if getattr(a, field) != getattr(b, field):
            return slug
    return "norm_flags"


def _said(slug: str, base: Wiring, new: Wiring) -> str:
    """What the current wiring says, in the words of the fault."""
    if slug in ("capture_layers", "concat_order", "config_file"):
        return f"capture layers {list(base.layers)}"
    if slug == "norm_flags":
        return ", ".join(f"{f} = {str(getattr(base, f)).lower()}" for f in NORM_FLAGS
                         if getattr(base, f) != getattr(new, f))
    return {"normalized_features": "raw features",
            "embeddings": "its own embeddings" if base.embeddings == "own" else "the target's embeddings",
            "vocab_map": f"the {base.vocab} vocab map", "rope": f"rope theta {base.rope_theta:g}",
            "position_shift": "features of the same position"}[slug]


def _search(bench: _Bench, start: Wiring, conventions: dict[str, tuple[int, ...]], progress: bool
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Wiring]:
    """Rounds of: measure every hypothesis against the current wiring, adopt the best significant one.

    Returns the findings (one per round that found something), the table of every measurement and
    the final wiring: what the weights fit.
    """
    from tqdm import tqdm

    base, adopted, findings, table = start, set(), [], []
    for rnd in range(1, MAX_ROUNDS + 1):
        hyps = [h for h in _hypotheses(base, bench, conventions if rnd == 1 else {}) if h.slug not in adopted]
        if not hyps:
            break
        base_out = bench.measure(base)
        tests = 2 * len(hyps)  # two tests per hypothesis
        results = []
        for h in tqdm(hyps, desc=f"doctor round {rnd}", unit="wiring", file=sys.stderr, disable=not progress):
            out = bench.measure(h.wiring)
            test = paired_test(base_out, out)
            results.append((h, out, test, beats(test, tests)))
            table.append({"round": rnd, "hypothesis": h.name, "fault": h.slug, **out.summary(),
                          "gain_depth1": _round(test["gain_depth1"]), "p_depth1": test["p_depth1"],
                          "p_chain": test["p_chain"], "significant": results[-1][3]})
        winners = [r for r in results if r[3]]
        if not winners:
            break
        h, out, test, _ = max(winners, key=lambda r: (r[2]["gain_accepted"], r[2]["gain_depth1"]))
        findings.append(_finding(
            h.slug, f"the weights fit {h.trained_for}, not {_said(h.slug, base, h.wiring)}",
            f"{h.name}: {_numbers(base_out, out, test, tests)}", h.fix, base_out, out, "measured",
            hypothesis=h.name, p_value=min(test["p_depth1"], test["p_chain"]), round=rnd))
        base = h.wiring
        adopted.add(h.slug)
    return findings, table, base


def _file_wirings(ckpt: Checkpoint, path: Path, layer_convention: str | None, tcfg: dict, N: int
                  ) -> dict[str, Wiring]:
    """The wiring each config file of the folder states, with the weights' own facts (embeddings, d2t)."""
    if path.is_file():
        return {ckpt.config_used: contract_wiring(ckpt.contract, ckpt.tensors, N)}
    out = {}
    for name in ckpt.files:
        c = read_checkpoint(path / name, layer_convention=layer_convention, verifier_config=tcfg,
                            load_tensors=False, strict=False).contract
        c = c.replace(has_embeddings=ckpt.contract.has_embeddings)
        out[name] = contract_wiring(c, ckpt.tensors, N)
    return out


def _config_files(bench: _Bench, files: dict[str, Wiring], reads: str, chosen: str, disagree: list[str]
                  ) -> tuple[list[dict[str, Any]], dict[str, Any], Wiring]:
    """Config files that state different wirings: measure each, say which one the weights fit.

    Returns findings, the per-file table and the wiring the search starts from (the best file's).
    """
    if len(set(files.values())) < 2:
        return [], {}, files[chosen]
    outs = {name: bench.measure(w) for name, w in files.items()}
    best = max(files, key=lambda n: (outs[n].depth1, float(outs[n].accepted.float().mean()), n == reads))
    table = {name: {**outs[name].summary(), "wiring": w.describe(), "read_by": _readers(name, reads, chosen)}
             for name, w in files.items()}
    what = "; ".join(disagree) or "they state different wirings"
    others = [n for n in files if files[n] != files[best]]
    fix = f"the weights fit {best}: delete {', '.join(others)} from the folder" + (
        f", then eyas convert DIR OUT --to both: OUT/config.json (what engines read) and OUT/config_eagle.json "
        f"will state {best}'s wiring" if best != reads else " (engines read config.json; eyas read the others first)")
    tests = len(files) - 1
    for name in dict.fromkeys([reads, chosen]):
        if files[name] == files[best]:
            continue
        test = paired_test(outs[name], outs[best])
        if beats(test, tests):
            finding = _finding(
                "config_file", f"{name} ({_readers(name, reads, chosen)}) does not fit the weights; {best} does",
                f"{what}. {name}: {files[name].describe()}; {best}: {files[best].describe()}. "
                f"{_numbers(outs[name], outs[best], test, tests)}", fix, outs[name], outs[best], "measured",
                p_value=min(test["p_depth1"], test["p_chain"]))
            return [finding], table, files[best]
    finding = _finding("config_file", "the config files disagree and the measurement cannot tell which is right",
                       f"{what}. " + "; ".join(f"{n}: depth-1 acceptance {outs[n].depth1:.3f}" for n in files),
                       "make the files agree: keep the one the draft was trained with, delete the others, then "
                       "eyas convert DIR OUT --to both", None, None, "static")
    return [finding], table, files[best]


def _readers(name: str, reads: str, chosen: str) -> str:
    who = ["engines" if name == reads else "", "eyas" if name == chosen else ""]
    return " and ".join(w for w in who if w) + " read it" if any(who) else "read by nobody by default"


def _serving_wirings(cons: dict[str, dict[str, Any]], engine: Wiring, has_embeddings: bool) -> dict[Wiring, list[str]]:
    """The wiring each consumer that loads the checkpoint would run (`eyas.check.consumers`)."""
    out: dict[Wiring, list[str]] = {}
    for name, r in cons.items():
        if not r["loads"] or not r["capture_layers"]:
            continue
        embeddings = "target" if r["embeddings"] == "shares target's" else "own"
        if embeddings == "own" and not has_embeddings:
            continue  # it would not run at all; `check` already says so
        w = dataclasses.replace(engine, layers=tuple(r["capture_layers"]), embeddings=embeddings,
                                norm_before_residual=r["norm_before_residual"], **r["norm_flags"])
        out.setdefault(w, []).append(name)
    return out


def _serving_fix(slug: str, ckpt: Checkpoint, final: Wiring, served: Wiring, names: list[str]) -> str:
    if slug == "capture_layers" and final.layers[0] == 1 and any(n.startswith("sglang") for n in names):
        return (f"SGLang reads eagle_config ids that start at 1 as output-of-layer ids and adds 1: it cannot capture "
                f"{list(final.layers)}; serve this draft with vLLM, or retrain it on layers that do not start at 1")
    if slug in ("capture_layers", "concat_order"):
        return (f"write the layer ids where every engine reads them: {_set(ckpt, 'layers', final.layers)} "
                "(eyas convert DIR OUT --to both writes both places)")
    if slug == "norm_flags":
        flags = [f for f in NORM_FLAGS if getattr(final, f) != getattr(served, f)]
        return "write every norm flag explicitly: " + "; ".join(_set(ckpt, f, getattr(final, f)) for f in flags)
    if slug == "embeddings":
        return ("SGLang always substitutes the target's embed_tokens; this draft needs its own: serve it with vLLM, "
                "or retrain it on the target's embeddings")
    return "make the checkpoint state it explicitly (eyas convert DIR OUT --to both)"


def _serving(bench: _Bench, serving: dict[Wiring, list[str]], final: Wiring, covered: set[Wiring],
             ckpt: Checkpoint) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Consumers that would wire the draft worse than what its weights fit: serving faults."""
    final_out, findings, table = bench.measure(final), [], {}
    todo = {w: names for w, names in serving.items() if w != final}
    for w, names in todo.items():
        out = bench.measure(w)
        for n in names:
            table[n] = {**out.summary(), "wiring": w.describe()}
        if w in covered:
            continue
        test = paired_test(out, final_out)
        if beats(test, len(todo)):
            slug = _differs(w, final)
            findings.append(_finding(
                slug, f"{', '.join(names)} would wire it with {_said(slug, w, final)}; the weights fit "
                      f"{_said(slug, final, w)}", _numbers(out, final_out, test, len(todo)),
                _serving_fix(slug, ckpt, final, w, names), out, final_out, "serving", consumers=names,
                p_value=min(test["p_depth1"], test["p_chain"])))
    for w, names in serving.items():
        if w == final:
            for n in names:
                table[n] = {**final_out.summary(), "wiring": w.describe()}
    return findings, table


# --- static findings ----------------------------------------------------------------------------


def _static_slug(p: dict[str, str]) -> str | None:
    """The fault slug of an `eyas check` problem, or None when it does not affect acceptance."""
    field, text = p["field"], p["problem"]
    if " disagree on " in text:
        return "config_file"
    if field in ("d2t", "t2d"):
        return "vocab_map"
    if field == "embed_tokens.weight":
        return "embeddings"
    if field == "fc.weight" or field == IDS and "not recorded" not in text:
        return "capture_layers"
    if field == "input_norm.weight" or field.startswith("fc_norm."):
        return "norm_flags"
    return None


def _hazard_slug(text: str) -> str:
    if "captures" in text:
        return "capture_layers"
    if any(f in text for f in NORM_FLAGS):
        return "norm_flags"
    if "embed_tokens" in text:
        return "embeddings"
    if "d2t" in text:
        return "vocab_map"
    return "config_file"


def _hazards(cons: dict[str, dict[str, Any]], ckpt: Checkpoint, final: Wiring) -> list[dict[str, str]]:
    """Where a consumer wires the checkpoint differently from its contract, with the agreeing fix."""
    fixes = {
        "capture_layers": f"write the ids in every place engines read: {_set(ckpt, 'layers', final.layers)} "
                          "(eyas convert DIR OUT --to both)",
        "norm_flags": "write every norm flag explicitly, top level and in eagle_config (eyas convert DIR OUT --to "
                      "both)",
        "embeddings": "delete embed_tokens.weight if the draft was trained on the target's embeddings; otherwise "
                      "serve it where its own are kept (vLLM)",
        "vocab_map": "add the d2t/t2d vocab map from the training run",
        "config_file": "write transformer_layer_config.model_type (eyas convert DIR OUT --to speculators)",
    }
    return [{"consumer": name, "hazard": m, "fault": _hazard_slug(m), "fix": fixes[_hazard_slug(m)]}
            for name, r in cons.items() for m in r["mismatches"]]


# --- engine dumps -------------------------------------------------------------------------------


def read_dump(path: str | Path) -> tuple[Tensor, Tensor]:
    """`input_ids` [T] and `features` [T, W] (fp32) from an engine dump (docs/engine-dumps.md).

    vLLM's ExampleHiddenStatesConnector files (`token_ids` [T], `hidden_states` [T, L, H]) are read
    as they are written: their layers are concatenated in the order vLLM stored them.
    """
    from safetensors import safe_open

    path = Path(path)
    hint = "a dump is a safetensors file with input_ids [T] (int64) and features [T, W]: see docs/engine-dumps.md"
    try:
        with safe_open(path, "pt") as f:
            t = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for missing or garbled files
        raise FormatError(f"{path}: not a readable safetensors file ({e})", hint) from None
    if "input_ids" not in t and {"token_ids", "hidden_states"} <= set(t):
        t = {"input_ids": t["token_ids"], "features": t["hidden_states"].flatten(1)}  # [T, L, H] -> [T, L*H]
    missing = sorted({"input_ids", "features"} - set(t))
    if missing:
        raise FormatError(f"{path}: no {', '.join(missing)} (found {sorted(t)})", hint)
    ids, feats = t["input_ids"], t["features"]
    if ids.ndim != 1 or ids.is_floating_point() or feats.ndim != 2 or not feats.is_floating_point() \
            or feats.shape[0] != ids.shape[0]:
        raise FormatError(f"{path}: input_ids is {ids.dtype} {list(ids.shape)} and features {feats.dtype} "
                          f"{list(feats.shape)}; expected int64 [T] and float [T, W]", hint)
    if ids.shape[0] < 4:
        raise FormatError(f"{path}: {ids.shape[0]} positions; at least 4 are needed to compare shifts", hint)
    return ids.long(), feats.float()


def _check_dump(dump: tuple[Tensor, Tensor], tgt: Target, path: str | Path) -> None:
    """A dump from another target or tokenizer cannot be matched: say so instead of matching noise."""
    ids, feats = dump
    if int(ids.max()) >= tgt.vocab_size or int(ids.min()) < 0:
        raise FormatError(f"{path}: token ids {int(ids.min())}..{int(ids.max())} are outside the vocab of "
                          f"{tgt.name} ({tgt.vocab_size})", "dump with the target's tokenizer, or pass --target")
    if feats.shape[1] % tgt.hidden_size:
        raise FormatError(f"{path}: features are {feats.shape[1]} wide, not a multiple of the hidden size "
                          f"{tgt.hidden_size} of {tgt.name}", "dump the target the draft serves, or pass --target")


@torch.no_grad()
def match_dump(features: Tensor, sample: dict[str, Tensor], bench: _Bench) -> list[dict[str, Any]]:
    """For each H-wide chunk of a dump's features, the target state it came from.

    Candidates: the residual stream at every index 0..N, each through the target's final norm (index
    N so is the final-normed state) and through layer k's input_layernorm (the normed input a hook on
    the attention sees), each at positions t-1, t and t+1. The best has the lowest median relative
    error |chunk - state| / |state| over positions 1..T-2 (where every shift exists); its mean cosine
    is reported beside it, and the runner-up from another layer or shift.
    """
    states = sample["states"]  # [T, N+1, H]
    T, H = states.shape[0], states.shape[-1]
    names, cands = [], []
    for k in range(states.shape[1]):
        for kind, f in (("raw", None), ("final_norm", bench.final_norm),
                        ("input_norm", bench.input_norms[k] if k < bench.N else None)):
            if kind == "raw" or f is not None:
                names.append((k, kind))
                cands.append(states[:, k] if f is None else f(states[:, k]))
    stack = torch.stack(cands)  # [C, T, H]
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
        out.append({"chunk": i, "layer": k, "state": kind, "shift": d, "rel_error": _round(rel), "cosine": _round(cos),
                    "identified": cos >= MATCH_COSINE and rel <= MATCH_REL_ERROR,
                    "runner_up": {"layer": k2, "state": kind2, "shift": d2, "rel_error": _round(rel2),
                                  "cosine": _round(cos2)}})
    return out


def _chunk_text(m: dict[str, Any]) -> str:
    kind = {"raw": "", "final_norm": " through the final norm", "input_norm": " through its input_layernorm"}
    at = "t" if m["shift"] == 0 else f"t{m['shift']:+d}"
    return (f"chunk {m['chunk']} = layer {m['layer']}{kind[m['state']]} at {at} (cosine {m['cosine']:.3f}, "
            f"relative error {m['rel_error']:.3f})")


def _dump_layers_fix(got: list[int], want: tuple[int, ...], N: int, ckpt: Checkpoint) -> str:
    if got == [k + 1 for k in want]:
        return ("the engine added 1 to the draft's layer ids (SGLang before PR #25454 reads eagle_config ids as "
                f"output-of-layer): {_set(ckpt, 'layers', want)}, or upgrade SGLang")
    if tuple(got) == default_capture_layers(N):
        return ("the engine did not read the draft's layer ids and fell back to (2, N//2, N-3) (vLLM reads only "
                f"the top-level ids): {_set(ckpt, 'layers', want)} (eyas convert DIR OUT --to both)")
    if got == [k - 1 for k in want]:
        return ("the engine captured one layer early (the output of layer k instead of its input, or ids read as "
                f"capture indices where they meant output-of-layer): make it capture {list(want)}")
    return f"make the engine capture layers {list(want)} (the draft's ids: {_set(ckpt, 'layers', want)})"


def _dump_findings(matches: list[dict[str, Any]], W: int, bench: _Bench, final: Wiring, before: Outcome | None,
                   after: Outcome, ckpt: Checkpoint) -> list[dict[str, Any]]:
    """What the engine got wrong, by comparing each chunk with what a correct engine feeds this draft:
    the raw residual stream at the draft's layers, in order, at the same position."""
    H, want = bench.H, final.layers
    seen = "; ".join(_chunk_text(m) for m in matches)

    def finding(slug: str, title: str, fix: str) -> dict[str, Any]:
        return _finding(slug, title, f"engine dump: {seen}", fix, before, after, "engine dump")

    if W == H and len(want) > 1:
        return [finding("fc_skipped", f"the engine fed one {H}-wide state, not {len(want)} concatenated: fc was "
                        "skipped and the EAGLE-3 draft ran as EAGLE-1",
                        "serve it as EAGLE-3: SGLang --speculative-algorithm EAGLE3, vLLM speculative_config "
                        "method \"eagle3\" (under EAGLE only the last hidden state is passed: sglang #21272)")]
    if W != len(want) * H:
        return [finding("capture_layers", f"the engine fed {W // H} states ({W} wide); the draft reads "
                        f"{len(want)} ({len(want) * H} wide)",
                        f"make the engine capture layers {list(want)}: {_set(ckpt, 'layers', want)}")]
    ok = [m for m in matches if m["identified"]]
    out = []
    got = [m["layer"] for m in matches]
    if len(ok) == len(matches) and got != list(want):
        if sorted(got) == sorted(want):
            out.append(finding("concat_order", f"the engine concatenated layers {got}; the draft reads {list(want)}",
                               "concatenate in the draft's order (engines append in layer order; a custom capture "
                               f"must too), or {_block_fix(tuple(got), want, H, bench.contract)}"))
        else:
            out.append(finding("capture_layers", f"the engine captured layers {got}; the draft reads {list(want)}",
                               _dump_layers_fix(got, want, bench.N, ckpt)))
    normed = [m for m in ok if m["state"] != "raw"]
    if normed:
        out.append(finding("normalized_features", f"the engine fed normed states ({_chunk_text(normed[0])}); the "
                           "draft reads the raw residual stream",
                           "capture hidden_states + residual before any norm (in fused add-norm layers the normed "
                           "output is not the residual stream)"))
    shifted = [m for m in ok if m["shift"]]
    if shifted:
        d = shifted[0]["shift"]
        out.append(finding("position_shift", f"features[t] are the target's states at t{d:+d}, not at t",
                           f"the engine pairs each token with the features of the position {'before' if d < 0 else 'after'}"
                           " it: features[t] must be the state at input_ids[t] (check its hidden-state bookkeeping "
                           "after accepted tokens)"))
    return out


def _dump_outcome(bench: _Bench, final: Wiring, sample: dict[str, Tensor], features: Tensor) -> Outcome | None:
    """The draft on what the engine fed it: fc skipped when only one hidden-size state came (as SGLang
    does), None when nothing can run on that width."""
    W, c = features.shape[1], bench.contract
    if W == len(final.layers) * c.target_hidden_size:
        cls = Drafter
    elif W == c.hidden_size:
        cls = _SkipFc
    else:
        return None
    return bench._run(bench.drafter(final, cls), [{**sample, "features": features}],
                      [target_greedy(sample, bench.lm_head)])


# --- the entry point ----------------------------------------------------------------------------

_DUMP_ORDER = ("fc_skipped", "capture_layers", "concat_order", "normalized_features", "position_shift")


def _conventions(path: Path, ckpt: Checkpoint, tcfg: dict, start: Wiring) -> dict[str, tuple[int, ...]]:
    """Capture layers under the other readings of nested eagle_config ids, when those are the source."""
    if "eagle_config." not in ckpt.origin.get("capture_layers", ""):
        return {}
    out = {}
    for conv in ("input", "output"):
        c = read_checkpoint(path, layer_convention=conv, verifier_config=tcfg, load_tensors=False, strict=False).contract
        if c.capture_layers is not None and tuple(c.capture_layers) != start.layers:
            out[conv] = tuple(c.capture_layers)
    return out


def _cannot_measure(rep, ckpt: Checkpoint, tcfg: dict) -> str | None:
    """Why the draft cannot be run on this target at all (then only static findings are reported)."""
    if not ckpt.tensors_loaded:
        return "the weights were not read (pass the checkpoint folder, with its weights)"
    fit = [p["problem"] for p in rep.problems if p["field"] in ("vocab_size", "draft_vocab_size", "target_hidden_size")]
    if fit:
        return "the draft does not fit this target: " + "; ".join(fit)
    c = ckpt.contract
    if c.hidden_size != tcfg.get("hidden_size") and not c.has_embeddings:
        return "the draft has no embed_tokens and its width differs from the target's"
    return None


def _measure(bench: _Bench, ckpt: Checkpoint, cons: dict[str, dict[str, Any]], files: dict[str, Wiring],
             disagree: list[str], conventions: dict[str, tuple[int, ...]], progress: bool
             ) -> tuple[list[dict[str, Any]], Wiring, dict[str, Any]]:
    """Config files, then the rounds of hypotheses, then the consumers: (findings, final wiring, table)."""
    reads = "config.json" if "config.json" in files else ckpt.config_used
    file_findings, file_table, start = _config_files(bench, files, reads, ckpt.config_used, disagree)
    found, table, final = _search(bench, start, conventions, progress)
    covered = ({start} if found else set()) | (set(files.values()) if file_findings else set())
    serving = _serving_wirings(cons, files[reads], ckpt.contract.has_embeddings)
    serve_findings, serve_table = _serving(bench, serving, final, covered, ckpt)
    contract_out, final_out = bench.measure(start), bench.measure(final)
    measured = {
        "data": bench.cap.source, "positions": bench.cap.positions, "depth": DEPTH,
        "contract": {"wiring": start.describe(), **contract_out.summary()},
        "trained_for": {"wiring": final.describe(), **final_out.summary()},
        "hypotheses": table, "config_files": file_table, "serving": serve_table,
        "test": (f"paired per position against the current wiring: exact McNemar on depth-1 outcomes and a sign "
                 f"test on accepted chain length (k={DEPTH}); significant when p x tests < {ALPHA} (Bonferroni) and "
                 f"the gain is >= {MIN_GAIN_DEPTH1} depth-1 acceptance or >= {MIN_GAIN_ACCEPTED} accepted tokens "
                 "per chain; the best is adopted, the rest re-tested. Features one position EARLY (t+1) are not "
                 "tried: they hand the draft the target's state after the token it must predict"),
    }
    return file_findings + found + serve_findings, final, measured


def _dump_section(bench: _Bench, final: Wiring, features: Tensor, path: Path, ckpt: Checkpoint
                  ) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """The engine dump matched against the target's states: (findings, report section, notes)."""
    sample = bench.cap.samples[0]
    matches = match_dump(features, sample, bench)
    on_dump, correct = _dump_outcome(bench, final, sample, features), bench.measure(final)
    findings = _dump_findings(matches, features.shape[1], bench, final, on_dump, correct, ckpt)
    lost = [m for m in matches if not m["identified"]]
    notes = ["dump chunks matching no target state: " + "; ".join(_chunk_text(m) for m in lost)
             + " (another target or precision, or tokens not aligned with features)"] if lost else []
    section = {"path": str(path), "positions": int(features.shape[0]), "width": int(features.shape[1]),
               "chunks": matches, "acceptance_on_dump": None if on_dump is None else on_dump.summary(),
               "acceptance_on_correct_features": correct.summary()}
    return sorted(findings, key=lambda f: _DUMP_ORDER.index(f["fault"])), section, notes


def diagnose(
    drafter: str | Path,
    *,
    target: str | Path | None = None,
    prompts: str | Path | None = None,
    features: str | Path | None = None,
    layer_convention: str | None = None,
    limit: int = DEFAULT_LIMIT,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    progress: bool = True,
    capture: Capture | None = None,
) -> dict[str, Any]:
    """Diagnose the draft checkpoint at `drafter` (a folder) against `target` (None: the embedded default).

    Static findings always; measured findings on the target's greedy answers to `limit` prompts
    (default MT-bench), or on the tokens of an engine dump (`features`, docs/engine-dumps.md), which is
    then also matched against the target's states. `capture` (from `collect`) reuses recorded states
    across calls (its target is used; `target` and `prompts` are then ignored). Returns the JSON report: `verdict` ("ok" | "faulty"), `findings` (most likely first:
    {fault, title, evidence, fix, acceptance_before, acceptance_after, tau_before, tau_after, source,
    ...}), `trained_for`, `static`, `hazards`, `consumers`, `measured`, `dump`, `notes`, `seconds`.
    """
    t0 = time.perf_counter()
    path = Path(drafter)
    tgt_dir = capture.target.path if capture is not None else resolve_target(target)
    rep = check_checkpoint(path, target=tgt_dir, layer_convention=layer_convention)
    ckpt, tcfg = rep.checkpoint, target_config(tgt_dir)
    cons = consumers(ckpt)
    N = tcfg["num_hidden_layers"]
    notes = [f"{name}: cannot load {r['reads']}: {r['notes'][-1]}" for name, r in cons.items() if not r["loads"]]
    report: dict[str, Any] = {
        "verdict": "ok", "findings": [], "drafter": str(path), "target": str(tgt_dir),
        "contract": ckpt.contract.to_dict(), "trained_for": None,
        "static": {"problems": [p for p in rep.problems if not _static_slug(p)], "warnings": rep.warnings},
        "hazards": [], "consumers": {n: {"reads": r["reads"], "loads": r["loads"], "notes": r["notes"]}
                                     for n, r in cons.items()},
        "measured": None, "dump": None, "notes": notes, "seconds": {},
    }
    final = contract_wiring(ckpt.contract, ckpt.tensors, N)
    findings: list[dict[str, Any]] = []
    why_not = _cannot_measure(rep, ckpt, tcfg)
    if why_not:
        notes.append(f"not measured: {why_not}")
    else:
        dump = read_dump(features) if features is not None else None
        tgt = capture.target if capture is not None else Target.load(tgt_dir, dtype=torch.float32)
        if dump is not None:
            _check_dump(dump, tgt, features)
            cap = _capture_tokens(tgt, dump[0], f"the {dump[0].shape[0]} tokens of engine dump {features}")
        else:
            cap = capture or collect(tgt, prompts, limit=limit, max_new_tokens=max_new_tokens, progress=progress)
        t1 = time.perf_counter()
        bench = _Bench(ckpt, cap, progress)
        files = _file_wirings(ckpt, path, layer_convention, tcfg, N)
        disagree = [p["problem"] for p in rep.problems if " disagree on " in p["problem"]]
        conventions = _conventions(path, ckpt, tcfg, contract_wiring(ckpt.contract, ckpt.tensors, N))
        findings, final, report["measured"] = _measure(bench, ckpt, cons, files, disagree, conventions, progress)
        if cap.positions < 200:
            notes.append(f"only {cap.positions} positions measured: small faults may not reach significance")
        if max([r["acceptance_depth1"] or 0 for r in report["measured"]["hypotheses"]]
               + [report["measured"]["trained_for"]["acceptance_depth1"] or 0]) < 0.05:
            notes.append("depth-1 acceptance is below 0.05 under every wiring tried: untrained weights, a draft "
                         "for another target, or a fault the doctor does not test")
        if dump is not None:
            dump_findings, report["dump"], dump_notes = _dump_section(bench, final, dump[1], Path(features), ckpt)
            findings += dump_findings
            notes += dump_notes
        report["seconds"].update(capture=round(cap.seconds, 1), measure=round(time.perf_counter() - t1, 1))
    for slug, p in ((_static_slug(p), p) for p in rep.problems):  # check's problems join their fault's finding
        if slug is None:
            continue
        same = next((f for f in findings if f["fault"] == slug), None)
        if same is not None:
            if p["problem"] not in same["evidence"]:
                same["evidence"] += f"; eyas check: {p['problem']}"
        else:
            findings.append(_finding(slug, p["problem"], f"eyas check: {p['problem']}", p["fix"], None, None, "static"))
    reads = "config.json" if "config.json" in ckpt.files else ckpt.config_used
    for w in rep.warnings:  # vLLM skips fc for this flag: the draft gets one state (formats reads it as a warning)
        if w.startswith(f"{reads}: eagle_config.use_aux_hidden_state is false"):
            findings.append(_finding("fc_skipped", w, f"eyas check: {w}", f"in {reads} set "
                                     "eagle_config.use_aux_hidden_state = true", None, None, "static"))
    if ckpt.contract.rope_theta is None and not any(f["fault"] == "rope" for f in findings):
        notes.append(f"the config names no rope_theta: every engine builds {DEFAULT_ROPE_THETA:g}"
                     + ("" if why_not else ", and the measurement found no better theta"))
    findings.sort(key=lambda f: math.inf if f["acceptance_before"] is None or f["acceptance_after"] is None
                  else f["acceptance_before"] - f["acceptance_after"])  # largest gain first, static last
    report.update(findings=findings, verdict="faulty" if findings else "ok", trained_for=final.describe(),
                  hazards=_hazards(cons, ckpt, final))
    report["seconds"]["total"] = round(time.perf_counter() - t0, 1)
    return report


# --- the readable report ------------------------------------------------------------------------


def _num(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _acc(f: dict[str, Any]) -> str:
    if f["acceptance_before"] is None or f["acceptance_after"] is None:
        return ""
    return (f" (depth-1 acceptance {_num(f['acceptance_before'])} -> {_num(f['acceptance_after'])}, tau(5) "
            f"{_num(f['tau_before'], '.2f')} -> {_num(f['tau_after'], '.2f')})")


def format_report(report: dict[str, Any]) -> str:
    """The report for humans: verdict, findings (most likely first) with numbers and the fix, then
    what the weights fit, the engine dump, consumer hazards, other problems, notes, and the table."""
    n = len(report["findings"])
    head = "OK: no fault found" if report["verdict"] == "ok" else f"FAULTY: {n} finding{'s' * (n != 1)}"
    lines = [f"eyas doctor {report['drafter']}: {head}", f"target: {report['target']}"]
    m = report["measured"]
    if m:
        lines.append(f"measured: {m['data']}, {m['positions']} positions, {report['seconds'].get('total')} s "
                     f"(capture {report['seconds'].get('capture')} s)")
    for i, f in enumerate(report["findings"], 1):
        lines += ["", f"{i}. [{f['fault']}] {f['title']}{_acc(f)}", f"   evidence: {f['evidence']}",
                  f"   fix: {f['fix']}"]
    if m:
        fit, said = m["trained_for"], m["contract"]
        lines += ["", f"the weights fit: {fit['wiring']}",
                  (f"  depth-1 acceptance {_num(fit['acceptance_depth1'])}, tau(5) {_num(fit['tau5'], '.2f')} (as "
                   f"the contract says: {_num(said['acceptance_depth1'])}, {_num(said['tau5'], '.2f')})")]
    d = report["dump"]
    if d:
        lines += ["", f"engine dump {d['path']}: {d['positions']} positions x {d['width']}"]
        lines += [f"  {_chunk_text(c)}{'' if c['identified'] else ' (no match)'}" for c in d["chunks"]]
        on = d["acceptance_on_dump"]
        lines.append(f"  draft on the dump: depth-1 {_num(on['acceptance_depth1']) if on else 'cannot run'}; on "
                     f"correct features: {_num(d['acceptance_on_correct_features']['acceptance_depth1'])}")
    if report["hazards"]:
        lines += ["", "consumer hazards (an engine wires the checkpoint differently from its contract):"]
        lines += [f"  - {h['consumer']}: {h['hazard']}\n      fix: {h['fix']}" for h in report["hazards"]]
    if report["static"]["problems"]:
        lines += ["", "other problems (eyas check; not acceptance faults):"]
        lines += [f"  - [{p['field']}] {p['problem']}\n      fix: {p['fix']}" for p in report["static"]["problems"]]
    if report["notes"]:
        lines += ["", "notes:"] + [f"  - {x}" for x in report["notes"]]
    if m and m["hypotheses"]:
        lines += ["", ("wirings measured (round: hypothesis, depth-1 acceptance, tau(5), p depth-1, * = significant; "
                       "after round 1 only the significant):")]
        for r in (r for r in m["hypotheses"] if r["round"] == 1 or r["significant"]):
            lines.append(f"  {r['round']}: {r['hypothesis']:<36} {_num(r['acceptance_depth1'])}  "
                         f"{_num(r['tau5'], '.2f')}  p={r['p_depth1']:.1e}{' *' if r['significant'] else ''}")
    return "\n".join(lines)
