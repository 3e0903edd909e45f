"""More training prompts without a download, kept apart from every evaluation set.

Three sources beside `sharegpt` (first human turns, as the shipped draft was trained):

- `sharegpt-clean`  every usable first human turn of the packaged ShareGPT, deduplicated (below).
- `sharegpt-turns`  every LATER user turn (2, 3, ...) of the same conversations, answered in
                    context: the prompt is the message list up to that turn, and the chat template
                    is applied to the whole list. The earlier assistant turns are the DATASET's
                    (ChatGPT's), not the target's own: each turn is then an independent prompt
                    (answered in any batch, split by `--skip` like any other), while regenerating
                    the earlier turns would chain j generations per turn j. The draft's loss covers
                    the target's own answer only, so what it learns to predict is still the target.
- self-written      prompts the target writes itself (`eyas.data.self_written`): they need the
                    target, so they are written to a JSONL file once and captured from that file.

Deduplication (`EvalIndex`) against every evaluation set eyas measures on: MT-bench (both turns of
the 80 questions), eyas's copy-heavy set and HumanEval. Text is normalised (NFKC, case-folded, words
= runs of letters and digits); a prompt is dropped when its normalised text equals an evaluation
text's (a hash), or when it shares a run of 13 words with one (GPT-3's contamination test; an
evaluation text of 8-12 words must appear whole; under 8 words, only the exact match counts: short
questions such as "Can you parallelize it?" are everyday follow-ups; runs of one-character words,
such as a list of hex digits, are no evidence of a copy). Exact duplicates inside a
source (by the same normalised hash) are dropped too. `cleaning_report` counts what each rule removed.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import re
import unicodedata
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eyas.data.prompts import SOURCES, Prompt, _take, copy_heavy_file, json_records, packaged_file, read_prompts
from eyas.errors import EyasError

NGRAM = 13  # words shared with an evaluation text that make a near-duplicate (GPT-3's test)
MIN_WHOLE = 8  # an evaluation text this long or longer (words) counts when it appears whole
_USER, _ASSISTANT = ("human", "user"), ("gpt", "assistant", "chatgpt", "bing", "bard")
_WORD = re.compile(r"\w+")


# --- deduplication -------------------------------------------------------------------------------


def words(text: str) -> list[str]:
    """The normalised words of a text: NFKC, case-folded, runs of letters and digits."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def text_key(text: str) -> str:
    """A hash of the normalised text: equal for texts that differ only in case, spacing, punctuation."""
    return hashlib.sha256(" ".join(words(text)).encode()).hexdigest()


def _grams(w: list[str], n: int) -> Iterator[str]:
    return (" ".join(w[i : i + n]) for i in range(len(w) - n + 1))


@dataclass
class EvalIndex:
    """The evaluation texts as exact hashes and word n-grams; `match` says which one a text copies."""

    exact: dict[str, str] = field(default_factory=dict)  # text_key -> origin
    grams: dict[str, str] = field(default_factory=dict)  # NGRAM words (joined by spaces) -> origin
    whole: list[tuple[str, str]] = field(default_factory=list)  # " w1 ... wk " of MIN_WHOLE..NGRAM-1 words, origin

    @classmethod
    def build(cls, texts: Iterable[tuple[str, str]]) -> EvalIndex:
        """From (origin, text) pairs."""
        index = cls()
        for origin, text in texts:
            w = words(text)
            index.exact.setdefault(text_key(text), origin)
            if len(w) >= NGRAM:
                for g in _grams(w, NGRAM):
                    if len(g) > 2 * NGRAM - 1:  # not all one-character words: "0 1 2 ... a b c" is no copy
                        index.grams.setdefault(g, origin)
            elif len(w) >= MIN_WHOLE:
                index.whole.append((f" {' '.join(w)} ", origin))
        return index

    def match(self, text: str) -> tuple[str, str] | None:
        """("exact" | "near", the evaluation origin) when `text` copies an evaluation text, else None."""
        if (origin := self.exact.get(text_key(text))) is not None:
            return "exact", origin
        w = words(text)
        hit = next((g for g in _grams(w, NGRAM) if g in self.grams), None)
        if hit is not None:
            return "near", self.grams[hit]
        joined = f" {' '.join(w)} "
        return next((("near", origin) for short, origin in self.whole if short in joined), None)


def eval_texts() -> list[tuple[str, str]]:
    """(origin, text) of every evaluation prompt: MT-bench (both turns), the copy set, HumanEval.

    Refused when a set's package is missing: training data cannot be checked against a set it
    cannot read, and installing the package later would measure on contaminated data.
    """
    out = []
    for _, rec in json_records(packaged_file("mtbench"), allow_truncated=False):
        out += [(f"mtbench {rec['question_id']} turn {j + 1}", t) for j, t in enumerate(rec["turns"])]
    out += [(f"copy line {n}", rec["prompt"]) for n, rec in json_records(copy_heavy_file(), allow_truncated=False)]
    with gzip.open(_humaneval_file(), "rt", encoding="utf-8") as f:
        out += [(f"humaneval {p['task_id']}", p["prompt"]) for p in (json.loads(x) for x in f if x.strip())]
    return out


def _humaneval_file() -> Path:
    """HumanEval's problems, or a refusal that says deduplication needs them."""
    try:
        return packaged_file("humaneval")
    except EyasError as e:
        raise EyasError(f"deduplicating against HumanEval: {e}", e.hint) from None


@functools.cache
def eval_index() -> EvalIndex:
    """The index of every evaluation set, built once per process (each source and the self-written
    prompts check against the same one; building it reads three packages)."""
    return EvalIndex.build(eval_texts())


def clean(prompts: Iterable[Prompt], index: EvalIndex, counts: dict[str, int] | None = None) -> Iterator[Prompt]:
    """The prompts that copy no evaluation text and repeat no earlier prompt (every user turn of a
    conversation is checked). `counts` (when given) gets what each rule removed."""
    seen: set[str] = set()
    keys: dict[str, str] = {}  # message -> text_key, and message -> index.match: the turns of one
    matches: dict[str, tuple[str, str] | None] = {}  # conversation repeat its earlier messages
    counts = {} if counts is None else counts
    for p in prompts:
        counts["read"] = counts.get("read", 0) + 1
        hit = copied(p, index, matches)
        key = "\0".join(keys.get(c) or keys.setdefault(c, text_key(c)) for _, c in (*p.history, ("user", p.text)))
        why = f"eval_{hit[0]}" if hit else "duplicate" if key in seen else None
        if why:
            counts[why] = counts.get(why, 0) + 1
            continue
        seen.add(key)
        yield p


def copied(p: Prompt, index: EvalIndex, matches: dict[str, tuple[str, str] | None] | None = None
           ) -> tuple[str, str] | None:
    """What the prompt copies (EvalIndex.match) at the first of its user turns, context first, that copies an
    evaluation text; None when none does. `matches` caches each message's match across prompts."""
    matches = {} if matches is None else matches
    for u in [c for r, c in p.history if r == "user"] + [p.text]:
        if u not in matches:
            matches[u] = index.match(u)
        if matches[u]:
            return matches[u]
    return None


def warn_copies(prompts: Sequence[Prompt], where: str | Path) -> None:
    """A prompt file's prompts that copy an evaluation text, said in one warning. They are kept (the file is
    the user's, and a capture of it resumes as before), but a draft trained on them is measured on its own
    training data by `eyas eval --prompts mtbench`; the packaged sources drop them (`clean`)."""
    index = eval_index()
    hits = [(p, hit) for p in prompts if (hit := copied(p, index))]
    if hits:
        shown = "; ".join(f"{p.origin} copies {origin} ({how})" for p, (how, origin) in hits[:3])
        more = f"; and {len(hits) - 3} more" if len(hits) > 3 else ""
        warnings.warn(f"{where}: {len(hits)} of {len(prompts)} prompts copy an evaluation text ({shown}{more}): a "
                      "draft trained on them is measured on its training data; remove them from the file",
                      stacklevel=2)


# --- ShareGPT sources ----------------------------------------------------------------------------


def sharegpt_conversations() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """(origin, alternating user/assistant messages) per packaged ShareGPT conversation: turns before
    the first user turn dropped (system turns; the assistant's end of a conversation split in two,
    whose first human turn `sharegpt` already reads), cut at the first turn that breaks the
    alternation or is empty."""
    for line, rec in json_records(packaged_file("sharegpt"), allow_truncated=True):
        turns = rec.get("conversations") if isinstance(rec, dict) else None
        origin = f"sharegpt line {line}" + (f" (id {rec['id']})" if isinstance(rec.get("id"), str) else "")
        msgs: list[tuple[str, str]] = []
        for t in turns if isinstance(turns, list) else []:
            who, text = (t.get("from"), t.get("value")) if isinstance(t, dict) else (None, None)
            role = "user" if who in _USER else "assistant" if who in _ASSISTANT else None
            if role != "user" and not msgs:
                continue  # before the first user turn
            if role != ("user" if len(msgs) % 2 == 0 else "assistant") or not isinstance(text, str) or not text.strip():
                break
            msgs.append((role, text))
        yield origin, msgs


def later_turns() -> Iterator[Prompt]:
    """User turns 2, 3, ... of every ShareGPT conversation, each with the conversation before it."""
    for origin, msgs in sharegpt_conversations():
        for j in range(2, len(msgs), 2):  # msgs[j] is user turn j // 2 + 1
            yield Prompt(msgs[j][1], f"{origin} turn {j // 2 + 1}", "sharegpt-turns", history=tuple(msgs[:j]))


def read_sharegpt_clean(limit: int | None = None) -> list[Prompt]:
    """Every usable first human turn of ShareGPT (as `sharegpt`), deduplicated."""
    firsts = (Prompt(p.text, p.origin, "sharegpt-clean") for p in read_prompts("sharegpt"))
    return _take(clean(firsts, eval_index()), limit)


def read_sharegpt_turns(limit: int | None = None) -> list[Prompt]:
    """Every later user turn of ShareGPT in its conversation, deduplicated."""
    return _take(clean(later_turns(), eval_index()), limit)


SOURCES.update({"sharegpt-clean": read_sharegpt_clean, "sharegpt-turns": read_sharegpt_turns})


def cleaning_report() -> dict[str, dict[str, int]]:
    """What deduplication removes from each ShareGPT source (read, duplicate, eval_exact, eval_near, kept)."""
    index, out = eval_index(), {}
    for name, prompts in (("sharegpt-clean", read_prompts("sharegpt")), ("sharegpt-turns", later_turns())):
        counts: dict[str, int] = {}
        counts["kept"] = sum(1 for _ in clean(prompts, index, counts))
        out[name] = counts
    return out
