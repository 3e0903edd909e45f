"""Prompts the target writes itself: unlimited in-distribution user turns, nothing fetched.

An instruct model has learned what its users write. Started at its own chat template's user header
(system turn included), it continues into a plausible user turn and closes it with its end-of-turn
token; sampled and seeded, that is as many prompts as one asks for, in the target's own
distribution. They need the target, so they are written to a JSONL file once and answered from it
like any prompt file (`eyas capture --prompts FILE`):

    python -m eyas.data.self_written --out self.jsonl --count 4096 --seed 0 [--target T] [--device cuda]

Turns cut by `max_new_tokens`, shorter than `min_words`, repeated, or copying an evaluation text
(`eyas.data.sources.EvalIndex`) are dropped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eyas.atomic import write_text
from eyas.data.answers import answer, eos_ids
from eyas.data.prompts import Prompt
from eyas.data.sources import eval_index, text_key, words
from eyas.errors import EyasError, FormatError

if TYPE_CHECKING:
    from eyas.target import Target


def user_header(tokenizer: Any) -> str:
    """The target's chat template up to where a user's words begin (system turn included)."""
    mark = "\x00EYAS-USER\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False)
    if mark not in text:
        raise FormatError("the target's chat template does not show the user's text verbatim",
                          "self-written prompts need a template that writes the user turn as given")
    return text[: text.index(mark)]


def write_self_prompts(target: Target, count: int, *, seed: int = 0, batch_size: int = 64, max_new_tokens: int = 128,
                       temperature: float = 1.0, top_p: float = 0.95, min_words: int = 3) -> list[Prompt]:
    """`count` user turns the target writes by continuing its own user header (sampled).

    Deterministic given the seed (and target, batch size, device): batch b samples with seed
    `(seed * 1_000_003 + b) % 2**63` (so any seed up to 2**63 - 1 fits torch's; a small one is unchanged).
    A turn counts when it ends with the end-of-turn token (not cut by `max_new_tokens`) and holds no
    other special token, has `min_words` words, copies no evaluation text and repeats no earlier turn.
    Stops after 4x the batches `count` needs, returning what it found.
    """
    check_sizes(count, batch_size, max_new_tokens)
    tok = target.tokenizer
    if not getattr(tok, "chat_template", None):
        raise FormatError(f"target {target.name} has no chat template", "self-written prompts need an instruct model")
    prefix = tok(user_header(tok), add_special_tokens=False)["input_ids"]
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens)
    eos, index, seen, out = set(eos_ids(target)), eval_index(), set(), []
    special = set(tok.all_special_ids)  # a turn holding one (another turn opened inside it) is no prompt
    device = target.model.device
    for b in range(4 * -(-count // batch_size)):
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed((seed * 1_000_003 + b) % 2**63)
            turns = answer(target, [prefix] * batch_size, sampling)
        for r, ids in enumerate(turns):
            if not ids or ids[-1] not in eos or special & set(ids[:-1]):
                continue
            text = tok.decode(ids[:-1], skip_special_tokens=True).strip()
            if len(words(text)) < min_words or index.match(text) or text_key(text) in seen:
                continue
            seen.add(text_key(text))
            out.append(Prompt(text, f"self-written seed {seed} batch {b} row {r}", "self-written"))
            if len(out) == count:
                return out
    return out


def check_sizes(count: int, batch_size: int, max_new_tokens: int, temperature: float = 1.0) -> None:
    """Refuse sizes below 1 and a temperature that samples nothing (before a target is loaded for nothing):
    nan wrote 1 prompt of 2, and -1 none, both said as success."""
    if min(count, batch_size, max_new_tokens) < 1:
        raise EyasError(f"count={count}, batch_size={batch_size}, max_new_tokens={max_new_tokens}: each must be >= 1",
                        "pass positive sizes")
    if not (math.isfinite(temperature) and temperature > 0):
        raise EyasError(f"--temperature {temperature}: must be a number > 0 (the turns are sampled)",
                        "leave it out (1.0), or e.g. --temperature 0.8")


def save_prompts(prompts: list[Prompt], path: Path, **meta: Any) -> None:
    """JSON lines `{"prompt", "id", ...meta}`, the format `read_prompts` (and `eyas capture --prompts`) reads;
    written atomically (eyas.atomic)."""
    write_text(path, "".join(json.dumps({"prompt": p.text, "id": p.origin, **meta}, ensure_ascii=False) + "\n"
                             for p in prompts))


# --- command line: python -m eyas.data.self_written ----------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Write the target's own prompts to a JSONL file; exit 2 with one `error:` line on bad input."""
    p = argparse.ArgumentParser(prog="python -m eyas.data.self_written",
                                description="the target writes COUNT user prompts (sampled, seeded) to OUT")
    p.add_argument("--out", required=True, type=Path, help="the JSONL file to write (eyas capture --prompts OUT)")
    p.add_argument("--count", type=int, required=True, help="prompts to write")
    p.add_argument("--target", help="a target model folder (default: the embedded default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--batch-size", type=int, default=64, help="turns sampled together (default: 64)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="longest turn in tokens (default: 128)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    p.add_argument("--device", help="torch device, e.g. cuda (default: cpu)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="target weights (default: bf16)")
    args = p.parse_args(argv)
    try:
        from eyas.target import Target

        from eyas.cli.outputs import output_file

        check_sizes(args.count, args.batch_size, args.max_new_tokens, args.temperature)
        output_file(args.out, "--out")
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        target = Target.load(args.target, dtype=dtype, device=args.device)
        found = write_self_prompts(target, args.count, seed=args.seed, batch_size=args.batch_size,
                                   max_new_tokens=args.max_new_tokens, temperature=args.temperature)
        save_prompts(found, args.out, target=target.name, seed=args.seed)
    except EyasError as e:
        print(f"error: {e}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {len(found)} of {args.count} prompts", file=sys.stderr)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
