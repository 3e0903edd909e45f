"""Offline acceptance: measure a draft standalone against the target's greedy choices.

Alignment (the one used everywhere in eyas, see `eyas.shift.shift_for_draft`): at position t the
draft reads target features g_t (prefix x_0..x_t) and token x_{t+1}; its step j predicts the token
after x_{t+1+j}. The target's greedy choice there is y_{t+1+j} = argmax(logits_{t+1+j}).

Why one teacher-forced unroll is exact for greedy chains: a chain is accepted up to depth j only if
every drafted token before j equalled the target's choice. On self-distilled greedy data the stored
tokens ARE those choices, so along an accepted chain the draft's own inputs equal the teacher-forced
inputs and the free-running draft computes exactly what the teacher-forced unroll computes. Where
the stored token is not the target's greedy choice (prompt text, sampled data) the chain beyond it
is unknown (`valid` is False there): the chain is cut there, as at the answer's end
(`eyas.acceptance.chain_acceptance`).
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from eyas.acceptance import difference, figures, sample_counts, stacked, top_ids
from eyas.atomic import write_figure
from eyas.contract import default_capture_layers
from eyas.data import MANIFEST, capture, prompts_fit, read_prompts, short_of_limit
from eyas.drafter_loading import load_drafter_and_config, resolve_drafter
from eyas.devices import on_gpu
from eyas.dtypes import AUTO, is_auto, to_dtype
from eyas.errors import ContractError, EyasError
from eyas.logit_map import LogitMap
from eyas.machine import bf16_dot_products, runs_on
from eyas.sampled import alpha_measure, answer_depths, require_sampleable, sampled_difference, sampled_report
from eyas.shift import label_ids, shift_for_draft, shift_left
from eyas.target import Target, TargetRef
from eyas.verdict import FROM_HEAD, FROM_TOKENS, check_cache_source, judged

if TYPE_CHECKING:
    from eyas.data.caches import CacheInfo


def chain_positions(T: int, depth: int) -> torch.Tensor:
    """[T, depth]: t + 1 + j, the position whose target token depth j of a chain from t predicts
    (>= T past the sample's end)."""
    return torch.arange(T).unsqueeze(1) + 1 + torch.arange(depth).unsqueeze(0)


def chain_truth(input_ids: torch.Tensor, greedy: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ground truth and validity for chains of `depth` draft tokens from every position.

    input_ids: [T] stored tokens x; greedy: [T] y_s = target argmax after x_0..x_s.
    Returns truth [T, depth] with truth[t, j] = y_{t+1+j}, and valid [T, depth]: the position
    exists and the target's answer at depth j is known. Depth 0 is always known (y_{t+1} is
    stored); depth j > 0 continues past the stored x_{t+1+j}, which the accepted draft token
    replaces, so that token must be the target's greedy choice (x_{t+1+j} == y_{t+j}).
    """
    T = input_ids.shape[0]
    idx = chain_positions(T, depth)
    inside = idx < T
    idx_c = idx.clamp(max=T - 1)
    truth = greedy[idx_c]
    # x_s is "on the greedy path" when x_s == y_{s-1}
    on_path = torch.zeros(T, dtype=torch.bool)
    on_path[1:] = input_ids[1:] == greedy[:-1]
    known = on_path[idx_c]
    known[:, 0] = True
    valid = inside & torch.cummin(known.int(), dim=1).values.bool()  # a running AND along depth
    return truth, valid


HEAD_ROWS = 256  # positions per full-vocabulary product: all of a 2048-token sample's logits over a
# 128k vocabulary would be 1 GB in fp32, 256 rows are 131 MB


def target_greedy(sample: dict, lm_head: torch.Tensor | None, *, first: int = 0) -> torch.Tensor:
    """y_s = the target's greedy token after x_0..x_s, from the stored final-normed state: [T].

    A sample that carries its verdict already (`greedy`: eyas.verdict, for a cache without the last
    hidden state) keeps it, and needs no lm_head. `first`: positions before it are not needed (-1
    there: no token), and their rows are not computed.
    """
    if "greedy" in sample:
        return sample["greedy"]
    h = sample["last_hidden"][first:].to(lm_head.dtype)
    # [R, H] @ [H, V] -> [R], HEAD_ROWS rows at a time; the argmax of the exact fp32 values (the same
    # index: the first maximum), which torch finds 3x faster than over bf16 on the AVX-512 EPYC
    # (benchmarks/README.md, bench_eval.py)
    y = torch.cat([(h[r:r + HEAD_ROWS] @ lm_head.T).float().argmax(-1) for r in range(0, h.shape[0], HEAD_ROWS)])
    return torch.cat([y.new_full((first,), -1), y]) if first else y


# Fewer chain starts than this are computed with the full unroll: a matrix product over a handful of
# rows (one row: a matrix-vector kernel; a few, split over threads) may round differently from the
# same rows inside a larger product, and saving those few rows is worth little.
ROWS_MIN = 32


def draft_starts(loss_mask: torch.Tensor) -> torch.Tensor:
    """[T - 1] bool: the draft positions chains start at. Draft position t reads x_{t+1} and is labelled
    with x_{t+2}: both must be answer tokens (the first answer token comes from the target's prefill;
    after the last one decoding stops), so a sample of 2 tokens or fewer has none."""
    answer = loss_mask[1:].bool()
    return answer & shift_left(answer, 1)


def _chain_starts(sample: dict) -> tuple[dict, torch.Tensor, torch.Tensor | None]:
    """The sample shifted for the draft, where chains start [T - 1] bool, and the start positions
    when they are enough to compute alone (else None: every position is computed)."""
    s = shift_for_draft(sample)
    starts = draft_starts(sample["loss_mask"])
    # the draft computes later steps at the chain starts only (row for row the same products, as long
    # as there are enough rows for the matrix kernels to stay the same: see ROWS_MIN)
    at = starts.nonzero()[:, 0] if int(starts.sum()) >= ROWS_MIN else None
    return s, starts, at


def answer_greedy(sample: dict, lm_head: torch.Tensor | None) -> torch.Tensor:
    """`target_greedy` at the rows `sample_predictions` reads (from the first chain start on), computed
    exactly as it computes them: what callers measuring several drafts on one sample pass in."""
    at = _chain_starts(sample)[2]
    return target_greedy(sample, lm_head, first=0 if at is None else int(at[0]))


def sample_predictions(drafter, sample: dict, lm_head: torch.Tensor, depth: int, top_k: int, *,
                       greedy: torch.Tensor | None = None, prune: int | None = None,
                       measure: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> dict:
    """Teacher-forced draft predictions and target ground truth for one unshifted sample.

    Chains start at every position whose given token x_{t+1} and first label x_{t+2} are part of
    the answer (loss_mask), i.e. the states decoding actually visits.
    Returns pred [N, depth], topk [N, depth, top_k] (target-vocab ids), truth/valid [N, depth], ended
    [N, depth] (the token that depth drafts lies past the answer's end, `eyas.sampled.answer_depths`:
    decoding stops there, so the chain is cut and no truth is read past it; `eyas.acceptance`),
    and in_vocab [N] (the depth-1 truth is in the draft vocab). `greedy`: `answer_greedy(sample,
    lm_head)` when the caller already has it.

    `measure(logits, rows)`, for measures beyond the argmax: called with each depth's draft logits
    at the chain starts [N, Vd] and the sample positions whose target distribution that depth is
    scored against [N] (truth[n, j] = greedy[rows[n, j]], rows >= `eyas.sampled.first_answer_row`);
    returns a tensor [N, ...]. The results come back stacked as `measured` [N, depth, ...], with `rows`
    [N, depth]. One depth's logits are held at a time: all of them, [N, depth, Vd], would be 2 GB in
    fp32 for 2048 starts, depth 8 and a 32k draft vocabulary.

    `prune` (a tree depth; not with `measure`): a chain start whose greedy chain and top-k tree of
    that depth have both ended is not drafted further (its later pred / topk are -1): what
    acceptance, chain tau and tree tau count is unchanged, and most starts end within a few steps.
    """
    ids = sample["input_ids"]  # [T]
    s, starts, at = _chain_starts(sample)
    if greedy is None:  # callers measuring many drafts on one sample pass it in (one full-vocab matmul)
        greedy = answer_greedy(sample, lm_head)
    truth, valid = chain_truth(ids, greedy, depth)
    rows = chain_positions(ids.shape[0], depth)[:-1].clamp(max=ids.shape[0] - 1)[starts]
    answered = answer_depths(sample, rows)  # the answer's end cuts a chain: no truth past it
    truth, valid = truth[: ids.shape[0] - 1][starts], valid[: ids.shape[0] - 1][starts] & answered
    dtype = next(drafter.parameters()).dtype
    next_ids = label_ids(s["input_ids"])  # teacher forcing: x_{t+2} at draft position t
    k = min(top_k, drafter.contract.draft_vocab_size)
    out = {"truth": truth, "valid": valid, "ended": ~answered}
    if prune is not None and at is not None and measure is None:
        topk = _pruned_topk(drafter, s, next_ids, at, truth, valid, depth, k, prune, dtype)
    else:
        states = drafter.forward_ttt(s["features"][None].to(dtype), s["input_ids"][None], depth,
                                     next_ids=next_ids[None], rows=at, logits=False)  # depth x [1, R, H]
        pick = slice(None) if at is not None else starts  # at None: every position was computed
        topk, measured = [], []
        for j, h in enumerate(states):  # the head over the rows forward_ttt's own would take: same products
            logits = drafter.head(h[0])[pick]  # [N, Vd]
            topk.append(drafter.to_target_ids(top_ids(logits, k)))
            if measure is not None:
                measured.append(measure(logits, rows[:, j]))
        topk = torch.stack(topk, dim=1)  # [N, depth, k]
        if measure is not None:
            out |= {"measured": torch.stack(measured, dim=1), "rows": rows}
    if drafter.contract.has_vocab_map:
        in_vocab = drafter.t2d[truth[:, 0]]
    else:
        in_vocab = torch.ones_like(truth[:, 0], dtype=torch.bool)
    return out | {"pred": topk[..., 0], "topk": topk, "in_vocab": in_vocab}


def _pruned_topk(drafter, s: dict, next_ids: torch.Tensor, at: torch.Tensor, truth: torch.Tensor,
                 valid: torch.Tensor, depth: int, k: int, tree_depth: int, dtype: torch.dtype) -> torch.Tensor:
    """topk [N, depth, k] of the teacher-forced unroll at the chain starts `at`, drafting a start only
    while its greedy chain or (within `tree_depth`) its top-k tree still holds the true token; -1
    where it was not drafted. At least ROWS_MIN rows stay in every product (ended ones fill up), so
    each kept row is computed as in the full unroll (bit for bit where the BLAS keeps its kernel for the
    smaller product; with two threads on an AMX Xeon, to fp32 rounding)."""
    topk = truth.new_full((len(at), depth, k), -1)
    chain = torch.ones(len(at), dtype=torch.bool)
    tree = torch.ones(len(at), dtype=torch.bool)
    current = torch.arange(len(at))  # the rows of `at` drafted at this step

    def record(j: int, out: torch.Tensor) -> None:
        top = drafter.to_target_ids(top_ids(out[0], k))  # [R_j, k]
        topk[current, j] = top
        ok, true = valid[current, j], truth[current, j]
        chain[current] &= (top[:, 0] == true) & ok
        tree[current] &= (top == true[:, None]).any(-1) & ok & (j + 1 < tree_depth)  # depth j + 2 in the tree

    def keep(j: int, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        nonlocal current
        record(j, out)
        go = chain[current] | tree[current]
        short = ROWS_MIN - int(go.sum())
        if short > 0:  # fill up with ended rows (the first ones): few rows may round differently
            go[(~go).nonzero()[:short, 0]] = True
        current = current[go]
        return go

    steps = drafter.forward_ttt(s["features"][None].to(dtype), s["input_ids"][None], depth, next_ids=next_ids[None],
                                rows=at, keep=keep)
    record(depth - 1, steps[-1])
    return topk


def evaluate_samples(drafter, samples, lm_head: torch.Tensor, *, depth: int = 8, tree_top_k: int = 4,
                     tree_depth: int = 5, temperature: float = 0.0, answers_temperature: float | None = None,
                     progress=None, against=None, where: str | Path = "the samples",
                     logit_map: LogitMap = LogitMap()) -> dict:
    """Offline acceptance of `drafter` over captured samples (see the module docstring).

    lm_head: the target's [V, H] output matrix (tied embeddings: the embedding matrix); `logit_map` what its
    class does to lm_head's output (eyas.logit_map: a sampled measure reads it, a greedy verdict needs not).
    Returns a JSON-ready dict (`eyas.acceptance.figures`): samples (read, and measured: those with a draft
    position; a cache whose loss masks are empty, or answers of 2 tokens or fewer, has fewer), tokens (chain
    starts evaluated),
    acceptance_by_depth, tau_chain (k = "1".."depth"), tau_tree (a full top-k tree of tree_depth
    levels along the greedy path), coverage (share of the target's next tokens inside the draft
    vocab), the counts, and ci95 (95% intervals of depth-1, chain and tree tau over resampled
    samples). With a `temperature` > 0 also `sampled`: the expected acceptance when serving samples
    at it (eyas.sampled; `answers_temperature`, what the answers were sampled at, only feeds its
    note). `against`: a second drafter measured on the same samples, reported as `against` with
    `difference` (and `sampled.difference`): this draft's figures minus its, with paired intervals.
    `where`: the data source a refusal names (no sample with a draft position gives no figures at all).
    """
    if temperature > 0 and lm_head is None:
        raise EyasError("sampled acceptance needs the target's distributions", "evaluate with the last hidden state")
    tree_d = min(tree_depth, depth)
    drafters = [drafter] + ([against] if against is not None else [])
    counts: list[list] = [[] for _ in drafters]
    sampled: list[list] = [[] for _ in drafters]
    read = 0
    with torch.inference_mode():
        for read, sample in enumerate(samples, 1):
            if not bool(draft_starts(sample["loss_mask"]).any()):
                continue
            greedy = answer_greedy(sample, lm_head)  # the target's verdict, once for every draft
            for d, c, s in zip(drafters, counts, sampled):
                part = _predictions(d, sample, lm_head, depth, tree_top_k, tree_d, temperature, greedy, logit_map)
                if temperature > 0:
                    s.append((part.pop("measured"), ~part["ended"]))  # the depths inside the answer
                c.append(sample_counts(part, tree_d))
            if progress is not None:
                progress(int(sample["loss_mask"].shape[0]))
    if not counts[0]:
        raise EyasError(f"{where}: no sample has a position the draft can be measured at ({read} read; one needs "
                        "two answer tokens in a row after the first token: rows of 2 tokens or fewer have none)",
                        "evaluate samples with answers (loss_mask) of 2 tokens or more")
    stacks = [stacked(c) for c in counts]
    measured = len(counts[0])  # the samples read less those without a position the draft is measured at
    reports = [figures(c, tree_top_k, tree_d) | {"samples": {"read": read, "measured": measured}} for c in stacks]
    if temperature > 0:
        for rep, s in zip(reports, sampled):
            rep["sampled"] = sampled_report(s, temperature, tree_top_k, tree_depth, answers_temperature)
    report = reports[0]
    if against is not None:
        report["against"] = reports[1] | {"difference": difference(*stacks)}
        if temperature > 0:
            report["against"]["sampled"]["difference"] = sampled_difference(sampled[0], sampled[1], tree_depth)
    return report


def _predictions(drafter, sample: dict, lm_head: torch.Tensor, depth: int, top_k: int, tree_depth: int,
                 temperature: float, greedy: torch.Tensor | None, logit_map: LogitMap) -> dict:
    """`sample_predictions` for one drafter: pruned for the greedy figures, or with the draft's
    distributions at every start (`alpha_measure`: the same greedy numbers) at a temperature."""
    if temperature > 0:
        measure = alpha_measure(drafter, sample, lm_head, temperature, top_k, logit_map)
        return sample_predictions(drafter, sample, lm_head, depth, top_k, greedy=greedy, measure=measure)
    return sample_predictions(drafter, sample, lm_head, depth, top_k, greedy=greedy, prune=tree_depth)


def evaluate(
    drafter_path,
    *,
    data=None,
    data_format: str | None = None,
    prompts=None,
    target=None,
    limit: int | None = None,
    max_new_tokens: int = 256,
    depth: int = 8,
    tree_top_k: int = 4,
    tree_depth: int = 5,
    dtype: str | torch.dtype = AUTO,
    device: str | torch.device | None = None,
    layer_convention: str | None = None,
    temperature: float = 0.0,
    against=None,
    progress: bool = True,
) -> dict:
    """`eyas eval`: load the draft, get features, measure acceptance.

    Exactly one of `data` (a feature cache: eyas shards, or another trainer's cache, detected or
    named by `data_format`: eyas.data.caches) or `prompts` (a prompt file, or "mtbench", answered
    by the target now) is used; `target` None is the embedded default. With `data` the target is
    never built: its verdict comes from the stored last hidden state through its final norm and
    lm_head (read by name from its shards), or, for a cache without one, from the stored tokens.
    `dtype` "auto" (`eval_dtype`): bf16 where the device multiplies it natively, else fp32.
    `temperature` > 0 adds the report's `sampled` section (eyas.sampled); prompts are then answered
    sampled at it (seed 0), as a fair estimate needs, and the greedy numbers are measured along
    those sampled answers. A cache without the last hidden state cannot give it and is refused.

    `prompts` are answered by transformers' `generate`, not by capture's faster loop
    (eyas.data.answers): in bf16 the two round differently, answers diverge after near-ties, and
    the shipped draft's MT-bench numbers move with the answers (depth-1 0.577 on generate's, 0.551 on
    the loop's, 0.566 on fp32's: docs/training.md); every MT-bench figure so far is on generate's.

    `against`: a second draft (a folder, or "default" for the shipped one) measured on the same
    samples; it must read the same capture layers. The report's `against` holds its figures and
    `difference`, this draft's minus its, with 95% intervals from the same resampled samples.
    """
    # other trainers' readers: only for --data
    from eyas.data.caches import NORMED, PRE_NORM, LongerThanContext, open_cache

    t0 = time.perf_counter()
    dtype = eval_dtype(dtype, device)
    ref = TargetRef.resolve(target, needed_by="eyas eval", device=device, dtype=dtype)
    if data is None:  # a prompt too long for the target: from its tokenizer, before any weights load
        asked = short_of_limit(read_prompts(prompts or "mtbench", limit=limit), limit, prompts or "mtbench")
        prompts_fit(ref, asked, max_new_tokens)
    drafter, config, layers = _drafter_and_layers(drafter_path, ref, layer_convention, dtype)
    other = None
    if against is not None:
        other, other_config, other_layers = _drafter_and_layers(against, ref, layer_convention, dtype)
        if other_layers != layers:
            raise EyasError(f"{other_config} (--against) reads capture layers {list(other_layers)} and {config} "
                            f"reads {list(layers)}: one set of features cannot measure both",
                            "compare drafts that read the same target layers (eyas check shows them)")
    given_data = data is not None
    with tempfile.TemporaryDirectory(prefix="eyas-eval-") as tmp:
        if data is None:
            capture(Target.load(ref), asked, layers, tmp, max_new_tokens=max_new_tokens, dtype=dtype, progress=progress,
                    do_sample=temperature > 0, temperature=temperature, seed=0, answers="generate")
            data, data_format = tmp, "eyas"
        cache = open_cache(data, format=data_format, num_layers=ref.num_layers, vocab_size=ref.vocab_size)
        info = cache.info
        check_cache_source(cache, ref)
        _check_layers(info, tuple(layers), config)
        if temperature > 0:
            require_sampleable(info)
        head = ref.head(normed=info.last_hidden == NORMED) if info.last_hidden else None
        bar = tqdm(unit="tok", desc="eval", file=sys.stderr, disable=not progress)
        if given_data:  # prompts were held to --limit as they were read
            short_of_limit(cache, limit, info.path, unit="sample")
        longer = LongerThanContext(ref.text_config.get("max_position_embeddings"))
        samples = judged(longer.passing(itertools.islice(cache, limit)), head, normed=info.last_hidden != PRE_NORM,
                         device=ref.device, vocab_size=ref.vocab_size, where=info.path)
        t1 = time.perf_counter()
        answers = _answers_temperature(cache)
        where = str(info.path) if info.path != Path(tmp) else f"captured now from {prompts or 'mtbench'}"
        report = evaluate_samples(drafter, samples, None if head is None else head.lm_head, depth=depth,
                                  tree_top_k=tree_top_k, tree_depth=tree_depth, temperature=temperature,
                                  answers_temperature=answers, progress=bar.update, against=other, where=where,
                                  logit_map=LogitMap() if head is None else head.logit_map)
        bar.close()
    seconds = time.perf_counter() - t1
    report["drafter"] = str(resolve_drafter(drafter_path, ref))
    if other is not None:
        report["against"]["drafter"] = str(resolve_drafter(against, ref))
    report["target"] = str(ref.path)
    report["capture_layers"] = list(layers)
    report["data"] = {"format": info.format, "path": where, "layers": info.layers_note,
                      "layers_recorded": info.layers_recorded, "answers": info.answers_note,
                      "verdict": FROM_HEAD if head is not None else FROM_TOKENS, "last_hidden": info.last_hidden,
                      "answers_temperature": answers,
                      "longer_than_context": len(longer.lengths)}
    longer.warn(where)
    report["cost"] = {"device": str(ref.device), "runs_on": runs_on(ref.device),
                      "dtype": str(dtype).removeprefix("torch."),
                      "seconds": round(time.perf_counter() - t0, 2), "measure_seconds": round(seconds, 2),
                      "positions_per_s": round(report["tokens"] / seconds, 1) if seconds > 0 else None,
                      "target_tensors_read": list(ref.read)}
    return report


def _drafter_and_layers(path, ref: TargetRef, layer_convention: str | None, dtype: torch.dtype):
    """The drafter at `path` on the target's device, its config, and the capture layers it reads (the
    engines' default for a draft that names none, with a warning)."""
    drafter, config = load_drafter_and_config(path, target=ref, layer_convention=layer_convention, dtype=dtype)
    drafter.to(ref.device)
    layers = drafter.contract.capture_layers
    if layers is None:
        layers = default_capture_layers(ref.num_layers)
        warnings.warn(f"{path} names no capture layers; using the engine default {list(layers)}", stacklevel=2)
    return drafter, config, tuple(layers)


def eval_dtype(dtype: str | torch.dtype, device: str | torch.device | None) -> torch.dtype:
    """`dtype`, or for "auto" bf16 on a GPU or a CPU with bf16 dot products (avx512_bf16, AMX, Arm
    bf16) and fp32 elsewhere: on an AVX2-only CPU bf16 products are emulated and eval runs about 3.5x
    slower in bf16 than in fp32 (benchmarks/README.md, bench_eval.py)."""
    if not is_auto(dtype):
        return to_dtype(dtype, (torch.bfloat16, torch.float32))
    return torch.bfloat16 if on_gpu(device) or bf16_dot_products() else torch.float32


def _answers_temperature(cache) -> float | None:
    """The temperature an eyas capture sampled its answers at (0: greedy); None for other caches."""
    if cache.info.format != "eyas":
        return None
    generation = cache.data.manifest.get("generation", {})
    return float(generation.get("temperature", 1.0)) if generation.get("do_sample") else 0.0


def check_slots(info: CacheInfo, reads: int, config, layers: tuple[int, ...] | None = None) -> None:
    """A cache that stores another count of states per position than the draft `reads`, refused naming
    it (fc would refuse the features without saying where they came from)."""
    if info.num_slots != reads:
        raise ContractError(
            f"{info.path}: {info.num_slots} captured layers per position ({info.layers_note}); the draft ({config}) "
            f"reads {reads}" + (f": capture {list(layers)}" if layers else ""),
            "evaluate on a cache taken at the draft's capture layers",
        )


def _check_layers(info: CacheInfo, layers: tuple[int, ...], config) -> None:
    """A cache that records other layers than the draft reads is refused; one that records none is
    read at the draft's layers, saying so (with how to confirm it) on stderr."""
    check_slots(info, len(layers), config, layers)
    if info.capture_layers is not None and info.layers_recorded and tuple(info.capture_layers) != layers:
        where = info.path / MANIFEST if info.format == "eyas" else info.path  # the file that records them
        raise ContractError(
            f"{where}: captured at layers {list(info.capture_layers)}, the draft ({config}) reads {list(layers)}",
            "capture again with the draft's capture layers",
        )
    if info.layers_recorded:
        return
    from eyas.data.caches.specforge import trained_reading  # the readers load only when a cache is given

    print(f"eyas: {info.format} cache {info.path}: {info.layers_note}", file=sys.stderr)
    trained = trained_reading(config.parent, info, layers)
    if info.capture_layers is not None and (tuple(info.capture_layers) != layers or trained):
        assumed = "the assumed layers" if tuple(info.capture_layers) == layers \
            else f"not the assumed {list(info.capture_layers)}"
        warnings.warn(f"the draft ({config}) reads capture {list(layers)}, {assumed}{trained}; evaluating as if the "
                      "cache held the draft's layers", stacklevel=2)
    print(f"eyas: to confirm the cache's layers, run: eyas doctor DRAFT --features {info.path} --target "
          "FULL_TARGET_FOLDER (matches the cache against the target's own states)", file=sys.stderr)


def plot_report(report: dict, path) -> None:
    """Acceptance by depth and chain tau vs k (with its 95% intervals), side by side, as a PNG; with
    `against`, the second draft beside the first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [report] + ([report["against"]] if "against" in report else [])
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    width = 0.8 / len(series)
    for i, rep in enumerate(series):
        label, acc = Path(rep["drafter"]).name, rep["acceptance_by_depth"]
        offset = (i - (len(series) - 1) / 2) * width
        a.bar([j + 1 + offset for j in range(len(acc))], acc, width=width, label=label)
        ks = sorted(rep["tau_chain"], key=int)
        tau, ci = [rep["tau_chain"][k] for k in ks], [rep["ci95"]["tau_chain"][k] for k in ks]
        b.errorbar([int(k) + offset / 4 for k in ks], tau, yerr=[[t - lo for t, (lo, _) in zip(tau, ci)],
                                                                 [hi - t for t, (_, hi) in zip(tau, ci)]],
                   marker="o", capsize=3, label=label)
    a.set(xlabel="draft depth", ylabel="acceptance (given earlier accepted)", ylim=(0, 1),
          title="per-depth acceptance")
    b.set(xlabel="draft tokens k", ylabel="tau (tokens per target pass)",
          title="greedy chain tau (95% intervals over samples)")
    if len(series) > 1:
        a.legend(fontsize=7)
    fig.suptitle(f"{report['drafter']}: {report['tokens']} positions")
    fig.tight_layout()
    write_figure(path, fig, dpi=120)
    plt.close(fig)
