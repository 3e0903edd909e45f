"""Capture: the target answers every prompt, then one forward captures its features as shards.

The target regenerates every response (self-distillation: the draft learns what THIS target says,
not what ShareGPT's ChatGPT said), then ONE forward over prompt + response captures the states
entering the capture layers and the final-normed state lm_head reads. Samples are stored UNSHIFTED
(features[t] has read x_0..x_t); `eyas.shift.shift_for_draft` aligns them for the draft in one
place. The shard and manifest format is `eyas.data.shards`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from eyas.atomic import make_folders
from eyas.contract import layer_problems
from eyas.data.answers import ANSWER_ENGINES, answer, pad_id
from eyas.data.prompts import DEFAULT_EVAL_PROMPTS, Prompt
from eyas.data.shards import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    forget_capture,
    generation_settings,
    read_manifest,
    record_shards,
    same_plan,
    shard_entry,
    shard_name,
    shard_problem,
    start_manifest,
    target_digest,
    text_sha256,
    write_shard,
)
from eyas.devices import room_for_a_copy
from eyas.dtypes import to_dtype
from eyas.errors import ContractError, EyasError, FormatError
from eyas.interrupt import Guard, on_signals

if TYPE_CHECKING:
    from eyas.target import Chat, Target, TargetRef

SHARD_SIZE = 64  # prompts per shard (at least one batch): what an interrupted capture redoes at most


def capture(
    target: Target,
    prompts: Sequence[Prompt | str],
    capture_layers: Sequence[int],
    out_dir: str | Path,
    *,
    max_new_tokens: int = 256,
    batch_size: int = 8,
    shard_size: int = SHARD_SIZE,
    dtype: torch.dtype | str = torch.bfloat16,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    max_length: int | None = None,
    skip_long: bool = False,
    progress: bool = True,
    device: str | torch.device | None = None,
    resumable: bool = False,
    answers: str = "eyas",
) -> dict[str, Any]:
    """Regenerate responses with `target` and store its features; returns the manifest.

    `resumable` (`eyas capture`; not the temporary captures of eval and doctor): SIGINT / SIGTERM
    stop it with `eyas.interrupt.Interrupted`, whose message says which shards are kept and how to
    resume.

    Each prompt goes through the target's chat template; the target answers it (greedy unless
    `do_sample`; batches are left-padded so every answer starts in the same column), and one
    forward over prompt + answer captures `features` at `capture_layers` and `last_hidden`. The
    loss mask covers the answer: every generated token up to and including the first end-of-turn
    token (an answer cut by `max_new_tokens` has none).

    The target runs on `device` (moved there; None: where it is). `answers` names who generates
    (eyas.data.answers): "eyas" (its lean batched loop where the target has one) or "generate"
    (Hugging Face's, for any target). Either's answers are the target's, so `answers` is not part
    of the capture's fingerprint and a capture may resume under the other (in bf16 the two round
    differently: an answer may change after a near-tie). Answers are generated a batch at a time
    inside a shard, so a shard holds at least `batch_size` prompts: large batches on a GPU stay large.

    Resumable: shard k always holds prompts [k*shard_size, (k+1)*shard_size); finished shards are
    kept, and a rerun with the same arguments continues after them. A folder holding a different
    capture is refused. A prompt that does not fit (`prompt + max_new_tokens > max_length`,
    default the target's context) is an error naming it, or skipped and listed with `skip_long`.
    """
    out_dir = Path(out_dir)
    if answers not in ANSWER_ENGINES:
        raise EyasError(f"answers={answers!r} is not an answering engine", f"use one of {', '.join(ANSWER_ENGINES)}")
    if min(max_new_tokens, batch_size, shard_size) < 1:
        raise EyasError(
            f"max_new_tokens={max_new_tokens}, batch_size={batch_size}, shard_size={shard_size}: each must be >= 1",
            "pass positive sizes",
        )
    prompts = [p if isinstance(p, Prompt) else Prompt(p, f"prompt {i}", "<list>") for i, p in enumerate(prompts)]
    layers = [int(k) for k in capture_layers]
    # the one rule drafts are read by (a cache out of order is one train refuses): the first fault raises
    problems = layer_problems(layers, target.num_layers) if layers else [{"problem": "no capture layers given"}]
    if problems:
        raise ContractError(problems[0]["problem"], f"pass --capture-layers a,b,c with 0 <= a < b < c <= "
                            f"{target.num_layers} (index k is the input of layer k of {target.name})")
    dtype = _feature_dtype(dtype)
    shard_size = shard_size_for(batch_size, shard_size)
    if device is not None:
        target.model.to(device)
    limit, prompt_ids, skipped = encode_fitting(target, prompts, max_new_tokens, max_length, skip_long)
    plan = _plan(target, prompts, layers, dtype, shard_size, max_new_tokens, limit, skip_long,
                 generation_settings(do_sample, temperature, top_p, top_k, seed))
    fresh, made = not (out_dir / MANIFEST).exists(), make_folders(out_dir)
    # refuses a folder holding another capture, or this one's target with other weights
    manifest = start_manifest(out_dir, plan, skipped, target_digest(target))

    shards = {e["index"]: e for e in manifest["shards"]}
    todo = [k for k in range(-(-len(prompts) // shard_size)) if k not in shards]
    for k in list(todo):  # a shard finished but not yet recorded (interrupted between two writes)
        path = out_dir / shard_name(k)
        if path.exists() and shard_problem(path, manifest) is None:
            shards[k] = shard_entry(path)
            todo.remove(k)
    if not todo and manifest["complete"]:  # run again as it was: nothing to capture, nothing to rewrite
        return manifest
    done = sum(e["prompts"][1] - e["prompts"][0] for e in shards.values())
    bar = tqdm(total=len(prompts), initial=done, unit="prompt", desc="capture", file=sys.stderr, disable=not progress)
    sampling = plan["generation"]

    def note() -> str:  # what an interrupted capture kept: eyas.interrupt
        return _resume_note(out_dir, len(shards), -(-len(prompts) // shard_size))

    try:
        with on_signals(note) if resumable else nullcontext() as guard:
            for k in todo:  # Ctrl-C / SIGTERM: finished shards stay, the one being captured is redone on resume
                start, stop = k * shard_size, min((k + 1) * shard_size, len(prompts))
                keep = [i for i in range(start, stop) if prompt_ids[i] is not None]
                samples = _capture_samples(target, [prompt_ids[i] for i in keep], layers, dtype, batch_size,
                                           sampling, seed_offset=k, on_batch=bar.update, lean=answers == "eyas")
                bar.update(stop - start - len(keep))
                for i, sample in zip(keep, samples):
                    _refuse_non_finite(target, prompts[i], sample)
                entry = {"index": k, "file": shard_name(k), "prompts": [start, stop]}
                _held(guard, True)  # a shard on disk is in the manifest and the note: a signal waits for both
                shards[k] = write_shard(out_dir, entry, keep, samples, manifest["fingerprint"])
                record_shards(out_dir, manifest, shards, complete=False)
                _held(guard, False)
            bar.close()
            return record_shards(out_dir, manifest, shards, complete=True)
    except BaseException:
        if fresh and not shards:  # nothing to resume: leave no manifest that would refuse other arguments
            forget_capture(out_dir, made)
        raise


def _held(guard: Guard | None, on: bool) -> None:
    """Hold signals while a shard is written and recorded (`on`), then stop for one that came meanwhile."""
    if guard is None:
        return
    guard.hold(on)
    if not on and guard.pending is not None:
        raise guard.stop()


def _resume_note(out_dir: Path, finished: int, total: int) -> str:
    """What an interrupted capture kept, and how to resume it (eyas.interrupt)."""
    if not finished:
        return f"no shard of {total} was finished, nothing is kept; rerun the `eyas capture` command to start again"
    return (f"{finished} of {total} shards in {out_dir} are finished and kept; rerun the same `eyas capture` "
            "command to resume after them")


def _feature_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """The dtype features are stored in (any spelling `eyas.dtypes` accepts)."""
    try:
        return to_dtype(dtype)
    except EyasError:
        raise EyasError(f"feature dtype {dtype!r} is not supported", "use bfloat16, float16 or float32") from None


def encode_fitting(target: Target | Chat, prompts: Sequence[Prompt], max_new_tokens: int, max_length: int | None,
                   skip_long: bool) -> tuple[int | None, list[list[int] | None], list[dict[str, Any]]]:
    """The token limit, then `encode_prompts` under it; refused when every prompt is skipped.

    `max_length` caps the target's context, never extends it: a longer sequence would reach
    positions the target has none for. A capture with no prompt left is refused here, before
    anything is written, rather than left as an empty capture that training refuses later.
    """
    context = target.context
    limit, set_by = context, f"the context of {target.name}"
    if max_length is not None and (context is None or max_length < context):
        limit, set_by = max_length, "the --max-length given"
    ids, skipped = encode_prompts(target, prompts, max_new_tokens, limit, skip_long, set_by=set_by)
    if prompts and len(skipped) == len(prompts):
        raise EyasError(f"all {len(prompts)} prompts are too long: with max_new_tokens={max_new_tokens} none fits "
                        f"in {limit} tokens, {set_by}; nothing to capture",
                        "lower --max-new-tokens, or pass shorter prompts")
    return limit, ids, skipped


def prompts_fit(target: str | Path | TargetRef | None, prompts: Sequence[Prompt], max_new_tokens: int, *,
                max_length: int | None = None, skip_long: bool = False) -> None:
    """Refuse prompts `encode_fitting` would refuse, from the target's tokenizer alone: seconds, where loading
    the weights (and `--dtype auto` timing them) takes minutes, so a prompt too long is said before either."""
    from eyas.target import Chat

    encode_fitting(Chat.load(target), prompts, max_new_tokens, max_length, skip_long)


def encode_prompts(
    target: Target | Chat, prompts: Sequence[Prompt], max_new_tokens: int, limit: int | None, skip_long: bool,
    *, set_by: str | None = None,
) -> tuple[list[list[int] | None], list[dict[str, Any]]]:
    """Chat-templated token ids per prompt (None where skipped), and the skipped prompts.

    `set_by` says where `limit` came from, for the error (default: the target's context). The
    error is shown by every verb that answers prompts, so its hint names CLI flags, and
    --skip-long as capture's alone.
    """
    tok = target.tokenizer
    if not getattr(tok, "chat_template", None):
        raise FormatError(
            f"target {target.name} has {'a tokenizer without a chat template' if tok else 'no tokenizer'}",
            "eyas answers prompts as a chat (instruct) model's assistant turn: use an instruct model's folder",
        )
    texts = [
        tok.apply_chat_template(p.messages(), tokenize=False, add_generation_prompt=True)  # history, then the turn
        for p in prompts
    ]
    # The template already wrote any BOS it wants; add_special_tokens would add a second one.
    ids = tok(texts, add_special_tokens=False)["input_ids"] if texts else []
    skipped = []
    for i, (p, row) in enumerate(zip(prompts, ids)):
        if limit is None or len(row) + max_new_tokens <= limit:
            continue
        if not skip_long:
            raise EyasError(
                f"{p.where}: {'it' if p.origin == 'the prompt' else 'the prompt'} is {len(row)} tokens with the "
                "chat template; with "
                f"max_new_tokens={max_new_tokens} it needs {len(row) + max_new_tokens} > {limit}, "
                f"{set_by or f'the context of {target.name}'}",
                _too_long_hint(limit - len(row), several=len(prompts) > 1),
            )
        skipped.append({"index": i, "origin": p.origin, "tokens": len(row)})
        ids[i] = None
    return ids, skipped


def _too_long_hint(room: int, *, several: bool) -> str:
    """How a prompt that does not fit can: `room` answer tokens are left beside it (none: shorten it)."""
    lower = [f"lower --max-new-tokens to {room} or less"] if room > 0 else []
    if not several:
        return lower[0] if lower else "shorten it (alone it fills the context)"
    return ", ".join(["shorten or remove it", *lower]) + ", or drop such prompts (capture: --skip-long)"


def prompts_plan(prompts: list[Prompt]) -> dict[str, Any]:
    """The prompts' part of a capture's plan: their count, digest and sources."""
    sources = sorted({p.source for p in prompts})
    return {"count": len(prompts), "sha256": text_sha256("\0".join(p.key for p in prompts)),  # a first turn: its text
            "sources": sources, "eval_only": DEFAULT_EVAL_PROMPTS in sources}


def same_prompts(out_dir: str | Path, prompts: list[Prompt]) -> None:
    """A capture resumed into `out_dir` with other prompts is refused from the prompts alone, before the target
    loads (the whole plan is compared again once it has)."""
    if (Path(out_dir) / MANIFEST).is_file():
        same_plan(read_manifest(Path(out_dir)), {"prompts": prompts_plan(prompts)}, Path(out_dir) / MANIFEST)


def shard_size_for(batch_size: int, shard_size: int = SHARD_SIZE) -> int:
    """Prompts per shard, as the manifest records them: at least one whole batch."""
    return max(shard_size, batch_size)


def _plan(target: Target, prompts: list[Prompt], layers: list[int], dtype: torch.dtype, shard_size: int,
          max_new_tokens: int, max_length: int | None, skip_long: bool, sampling: dict[str, Any]) -> dict[str, Any]:
    """Everything that determines the shards' content; a resumed run must match it exactly."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **plan_head(target, layers, dtype),
        "shard_size": shard_size,
        "prompts": prompts_plan(prompts),
        "generation": {"max_new_tokens": max_new_tokens, "max_length": max_length, "skip_long": skip_long,
                       "chat_template_sha256": text_sha256(json.dumps(target.tokenizer.chat_template, sort_keys=True)),
                       **sampling},
    }


def plan_head(target: Target | TargetRef, layers: Sequence[int], dtype: torch.dtype) -> dict[str, Any]:
    """The part of a capture's plan its target's config and the flags decide: capture's preflight compares
    it before the target loads (a TargetRef), the capture after (the Target)."""
    return {"target": {"name": target.name, "num_layers": target.num_layers, "hidden_size": target.hidden_size,
                       "vocab_size": target.vocab_size},
            "capture_layers": list(layers), "dtype": str(dtype).removeprefix("torch.")}


def _refuse_non_finite(target: Target, prompt: Prompt, sample: dict[str, torch.Tensor]) -> None:
    """A shard is written only with finite states: NaN or inf there comes from the target (a damaged
    weight, an overflow), and every draft trained on it learns nothing."""
    bad = next((k for k in ("features", "last_hidden") if not bool(torch.isfinite(sample[k]).all())), None)
    if bad is not None:
        raise EyasError(f"target {target.name}: its {bad} on {prompt.origin} are not finite (NaN or inf)",
                        "check the target's weights for NaN/inf, or capture in bf16 or fp32 (fp16 overflows)")


def _capture_samples(target: Target, prompt_ids: list[list[int]], layers: list[int], dtype: torch.dtype,
                     batch_size: int, sampling: dict[str, Any], *, seed_offset: int,
                     on_batch: Callable[[int], Any], lean: bool) -> list[dict[str, torch.Tensor]]:
    """Generate answers and capture features for a list of prompts, in their order."""
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # less padding per batch
    out: list[dict[str, torch.Tensor] | None] = [None] * len(prompt_ids)
    device = target.model.device
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        if sampling["do_sample"]:  # a resumed shard samples as it would have
            torch.manual_seed((sampling["seed"] + seed_offset) % 2**63)
        for b in range(0, len(order), batch_size):
            batch = order[b : b + batch_size]
            answers = answer(target, [prompt_ids[i] for i in batch], sampling, lean=lean)
            seqs = [prompt_ids[i] + a for i, a in zip(batch, answers)]
            captured = _forward(target, seqs, layers)
            for i, a, seq, (feats, last) in zip(batch, answers, seqs, captured):
                mask = torch.zeros(len(seq), dtype=torch.bool)
                mask[len(seq) - len(a) :] = True  # the answer, end-of-turn token included
                out[i] = {"input_ids": torch.tensor(seq), "loss_mask": mask,
                          "features": feats.to("cpu", dtype), "last_hidden": last.to("cpu", dtype)}
            on_batch(len(batch))
    return out


@torch.inference_mode()
def _forward(target: Target, seqs: list[list[int]], layers: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(features [T, A*H], last_hidden [T, H]) per sequence, from one forward over the batch.

    Right padding needs no attention mask: attention is causal, so the padding after a sequence
    cannot change its states. On a CPU, where a copy fits, the decoder's linears run packed
    (eyas.decode.packed; lm_head is not needed): on AVX-512 the same bf16 features, 10% sooner; on
    AVX2 eyas's bf16 kernel, 2.9x sooner, its sums in another order (the features move by 0.6% of
    their norm, as much as transformers' own AVX2 and AVX-512 features differ: benchmarks/README.md).
    """
    from eyas.decode.packed import is_packed, packed_linears  # loaded by a capture, not by the CLI

    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id(target), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    decoder = target.decoder
    packed = target.model.device.type == "cpu" and room_for_a_copy(decoder, made=is_packed(decoder))
    with packed_linears(decoder) if packed else nullcontext():
        out = target.forward(ids.to(target.model.device), layers, with_logits=False)
    return [(out.features[b, : len(s)], out.last_hidden[b, : len(s)]) for b, s in enumerate(seqs)]
