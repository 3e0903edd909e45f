"""Draft-vocab coverage against its size: how much of the target's answers N draft tokens cover.

Coverage caps depth-1 acceptance (a token outside the draft vocab is never drafted), and a bigger
vocab costs a bigger lm_head in every TTT step. Vocabularies are built as `eyas train --draft-vocab N`
builds them (the N most frequent label tokens), here from ShareGPT's own reference answers (the first
assistant turn of conversations [a, b), tokenized with the target's tokenizer): a proxy for the
target's answers that needs no generation. Coverage is measured on the answer tokens of captures (the
draft's labels, what the target actually says; `eyas.train.vocab_coverage`), and for comparison the
vocab map of an existing draft (`--draft`, built from the target's own answers) on the same tokens.

    .venv/bin/python benchmarks/vocab_coverage.py --data SHARDS --sizes 4096,8192,16384,32768 --build 0:3072 \\
        --draft src/eyas/drafts/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import AutoTokenizer

from eyas.data import json_records, open_shards, packaged_file
from eyas.drafter_loading import load_drafter
from eyas.shift import shift_for_draft
from eyas.target import resolve_target, target_config
from eyas.train import build_vocab_map, token_counts, vocab_coverage
import flags


def reference_counts(tokenizer, vocab_size: int, start: int, stop: int) -> torch.Tensor:
    """Token counts [V] of ShareGPT's first assistant answer in conversations start..stop-1."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for n, (_, record) in enumerate(json_records(packaged_file("sharegpt"), allow_truncated=True)):
        if n >= stop:
            break
        if n < start or not isinstance(record, dict):
            continue
        turns = record.get("conversations") or []
        answer = next((t.get("value") for t in turns if t.get("from") == "gpt"), None)
        if answer:
            ids = torch.tensor(tokenizer(answer, add_special_tokens=False)["input_ids"], dtype=torch.int64)
            counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="capture folder(s), comma-separated: the answers measured")
    p.add_argument("--sizes", type=flags.counts, default="4096,8192,16384,32768",
                   help="draft-vocab sizes, comma-separated")
    p.add_argument("--build", default="0:3072", metavar="A:B", help="ShareGPT conversations the vocabs are built from")
    p.add_argument("--draft", help="also the coverage of this draft's own vocab map")
    p.add_argument("--target", default=None, help="target folder (default: the embedded default)")
    args = p.parse_args(argv)
    V = target_config(args.target)["vocab_size"]
    samples = [shift_for_draft(s) for f in args.data.split(",") for s in open_shards(f)]
    measured = token_counts(samples, V)
    start, stop = (int(x) for x in args.build.split(":"))
    built = reference_counts(AutoTokenizer.from_pretrained(resolve_target(args.target)), V, start, stop)
    report = {"answer_tokens": int(measured.sum()), "built_from_tokens": int(built.sum()), "coverage": {}}
    for n in args.sizes:
        report["coverage"][n] = round(vocab_coverage(measured, build_vocab_map(built, n)[2]), 4)
    if args.draft:
        t2d = load_drafter(args.draft, target=args.target).t2d
        report["draft"] = {"path": args.draft, "size": int(t2d.sum()),
                           "coverage": round(vocab_coverage(measured, t2d), 4)}
    for n, c in report["coverage"].items():
        print(f"{n:>6} tokens: coverage {c:.4f}", file=sys.stderr)
    flags.emit(report)
    return 0


if __name__ == "__main__":
    sys.exit(flags.run(main))
