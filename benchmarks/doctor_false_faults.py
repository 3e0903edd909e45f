"""How often does `eyas doctor` name a fault that is not there? Runs it on correctly wired drafts over
disjoint sets of MT-bench questions and prints, per run, the verdict and the strongest alternative
wiring's evidence: p over positions (the deciding test) against the answers in its favour (the
sign test over answers, where draws are independent). Prints one JSON line per run, then a summary.

Drafts (all wired as their configs say): the shipped one, `--draft DIR` (repeatable: e.g. the draft
before it, `git show 7a0360b~1:src/eyas/drafts/smollm2-135m-instruct/...`), and the shipped one with
Gaussian noise of `--noise` x each matrix's std added (norms untouched, seed 0): a weak draft whose
wiring is still right. Each question set is answered and captured once, then diagnosed for every draft;
the set's file goes on with the questions after it, which the doctor answers where it doubts (positions
and answers disagree), once for all drafts.

`--on` says what the doctor is handed, all of it correct for the shipped draft's layers [2, 15, 27]:
`prompts` (the questions, answered by the doctor), `cache` (`--features`: eyas's capture of the set's
answers, then of the questions after it, read as a trainer's feature cache), `dump` (`--features`: an
engine dump of the set's first question and its answer, beside the answered questions).

    .venv/bin/python benchmarks/doctor_false_faults.py --sets 10 --draft /tmp/olddraft --noise 0.2

On the 2-core AVX-512 EPYC, 2026-12-05, that command (the draft before the shipped one in /tmp/olddraft)
took 8.6 minutes: 30 runs ok, one of them (the noised draft on questions 145-152) after doubting twice.
Before the doctor asked the answers to agree, it named a fault there (benchmarks/README.md). With
`--on cache` and `--on dump`: benchmarks/README.md ("The doctor on a cache or a dump").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eyas.bench import git_commit
from eyas.data import capture, open_shards, read_prompts
from eyas.doctor import DEFAULT_LIMIT, DEFAULT_MAX_NEW_TOKENS, collect, diagnose
from eyas.drafter_loading import resolve_drafter
from eyas.target import Target
import flags

LAYERS = [2, 15, 27]  # the shipped draft's: every cache and dump here is correct for it


def noised(src: Path, dst: Path, scale: float) -> Path:
    """A copy of the draft at `src` with N(0, (scale x std)^2) added to every matrix but the norms."""
    dst.mkdir(parents=True)
    for f in src.glob("*.json"):
        shutil.copy(f, dst / f.name)
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, t in load_file(src / "model.safetensors").items():
        if t.is_floating_point() and t.ndim >= 1 and "norm" not in name:
            x = t.float()
            t = (x + scale * x.std() * torch.randn(x.shape, generator=g)).to(t.dtype)
        out[name] = t
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def strongest(report: dict) -> dict:
    """The alternative wiring with the smallest position-level p, and its evidence."""
    h = min(report["measured"]["hypotheses"], key=lambda h: min(h["p_logprob"], h["p_kl"]))
    return {"hypothesis": h["hypothesis"], "p_positions": min(h["p_logprob"], h["p_kl"]),
            "gain_logprob": h["gain_logprob"], "gain_depth1": h["gain_depth1"],
            "answers_favouring": h["samples_favouring"], "p_answers": h["p_samples"],
            "answers_favouring_kl": h["samples_favouring_kl"], "p_answers_kl": h["p_samples_kl"],
            "adopted": h["significant"]}


def handed(on: str, tgt: Target, file: Path, size: int, folder: Path) -> dict:
    """What `diagnose` is given besides the draft: the target's answers to the set (`prompts`, a
    capture shared by every draft and extended where the doctor doubts), a cache of the set's answers
    and of 3 x `size` questions after it (`cache`: eyas's capture, fp32), or an engine dump of the
    first answer beside the answers (`dump`)."""
    answered = None if on == "cache" else collect(tgt, file, limit=size, progress=False)
    if on == "prompts":
        return {"capture": answered}
    cache = folder / "cache"
    capture(tgt, read_prompts(file, limit=(4 if on == "cache" else 1) * size), LAYERS, cache,
            max_new_tokens=DEFAULT_MAX_NEW_TOKENS, dtype="float32", progress=False)
    if on == "cache":
        return {"features": cache}
    first = next(iter(open_shards(cache)))
    dump = folder / "dump.safetensors"
    save_file({"input_ids": first["input_ids"], "features": first["features"].contiguous()}, dump)
    return {"features": dump, "capture": answered}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", type=flags.count, default=10,
                   help="disjoint sets of MT-bench questions (at most 80 / size)")
    p.add_argument("--size", type=flags.count, default=DEFAULT_LIMIT, help="questions per set (the doctor's default)")
    p.add_argument("--draft", type=Path, action="append", default=[], help="another correctly wired draft")
    p.add_argument("--noise", type=float, default=0.2, help="the noised draft's scale (0: none)")
    p.add_argument("--on", choices=("prompts", "cache", "dump"), default="prompts", help="what the doctor is handed")
    args = p.parse_args(argv)
    questions = read_prompts("mtbench")
    if args.sets * args.size > len(questions):
        p.error(f"{args.sets} sets of {args.size} need {args.sets * args.size} questions; "
                f"MT-bench has {len(questions)}")
    with tempfile.TemporaryDirectory(prefix="eyas-false-faults-") as tmp:
        shipped = resolve_drafter(None, None)
        drafts = {"shipped": shipped, **{d.name: d for d in args.draft}}
        if args.noise:
            drafts[f"noised {args.noise:g}"] = noised(shipped, Path(tmp, "noised"), args.noise)
        faults = {name: 0 for name in drafts}
        tgt = Target.load(None, dtype=torch.float32)
        for s in range(args.sets):
            chosen = questions[s * args.size:] + questions[:s * args.size]  # the set, then the questions after it
            file = Path(tmp, f"set{s}.jsonl")
            file.write_text("".join(json.dumps({"prompt": q.text}) + "\n" for q in chosen))
            given = handed(args.on, tgt, file, args.size, Path(tmp, f"set{s}"))
            for name, d in drafts.items():
                rep = diagnose(d, **given, progress=False)
                faults[name] += rep["verdict"] != "ok"
                flags.emit({"draft": name, "questions": f"{chosen[0].origin} .. {chosen[args.size - 1].origin}",
                            "measured": rep["measured"]["data"], "verdict": rep["verdict"],
                            "faults": [f["fault"] for f in rep["findings"]], "strongest": strongest(rep),
                            "doubts": [n for n in rep["notes"] if "not across answers" in n]})
    flags.emit({"bench": "doctor_false_faults", "on": args.on, "false_faults": faults, "runs_per_draft": args.sets,
                "questions_per_run": args.size, "torch": torch.__version__, "commit": git_commit()})
    return 0


if __name__ == "__main__":
    sys.exit(flags.run(main))
