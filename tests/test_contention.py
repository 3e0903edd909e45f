"""Timings made while other processes took the CPU are provisional (eyas.machine.Contention): used,
made again at the next runs, the quietest kept; decisions cached from a quiet machine stand."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import fake_dtype_measurement

import eyas.bench.sweep as sweep_module
import eyas.generate as generate_module
from eyas import machine
from eyas.draft_shape import needs_sweep, read_best_shape
from eyas.generate import MEASURED_AGAIN, choose_shape

READ_MACHINE = machine._machine_seconds  # taken before conftest's quiet_machine replaces it in each test


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def fake_clock(monkeypatch, machine_seconds: list, own_seconds: list) -> None:
    """/proc/stat's (busy, total) and this process's CPU seconds, one value per reading."""
    monkeypatch.setattr(machine, "_machine_seconds", lambda: machine_seconds.pop(0))
    monkeypatch.setattr(machine, "_own_seconds", lambda: own_seconds.pop(0))


def test_others_share_is_the_busy_time_this_process_did_not_use(monkeypatch):
    # 4 cores, 200 CPU-seconds passed, 140 of them busy, 40 of those ours: others kept 2 cores busy
    fake_clock(monkeypatch, [(100.0, 200.0), (240.0, 400.0)], [10.0, 50.0])
    assert machine.Contention(threads=4, cpus=4).others() == 0.5  # they took half the cores we ran on
    fake_clock(monkeypatch, [(100.0, 200.0), (240.0, 400.0)], [10.0, 50.0])
    assert machine.Contention(threads=2, cpus=4).others() == 0.0  # on the two cores we left free
    fake_clock(monkeypatch, [(100.0, 200.0), (240.0, 400.0)], [10.0, 50.0])
    assert machine.Contention(threads=3, cpus=4).others() == 0.333
    fake_clock(monkeypatch, [(100.0, 200.0), (150.0, 400.0)], [10.0, 70.0])  # ours exceeds the busy ticks
    assert machine.Contention(threads=4, cpus=4).others() == 0.0
    fake_clock(monkeypatch, [None, (150.0, 400.0)], [10.0, 70.0])  # /proc/stat unreadable: unknown
    assert machine.Contention().others() is None


def test_this_machines_reading_is_monotone_or_unknown():
    """/proc/stat as read here: busy within total, both growing (None in a container that sees its host)."""
    first = READ_MACHINE()
    sum(i * i for i in range(200_000))
    second = READ_MACHINE()
    if first is None:
        assert second is None
        return
    assert 0 <= first[0] <= first[1] and first[0] <= second[0] and first[1] <= second[1]


def test_provisional_timings_are_repeated_and_the_quietest_stands():
    quiet = machine.quietest({"best": "a", "others_cpu_share": 0.1}, None)
    assert not quiet["busy"] and quiet["attempts"] == 1 and machine.settled(quiet) and machine.busy_note(quiet) == ""
    first = machine.quietest({"best": "a", "others_cpu_share": 0.6}, None)
    assert first["busy"] and not machine.settled(first) and "attempt 1 of 3" in machine.busy_note(first)
    second = machine.quietest({"best": "b", "others_cpu_share": 0.8}, first)  # louder: the first stands
    assert second["best"] == "a" and second["attempts"] == 2 and not machine.settled(second)
    third = machine.quietest({"best": "c", "others_cpu_share": 0.4}, second)  # quieter, still busy: the last try
    assert third["best"] == "c" and third["attempts"] == 3 and machine.settled(third)
    assert "quietest of 3" in machine.busy_note(third)
    calm = machine.quietest({"best": "d", "others_cpu_share": 0.05}, second)
    assert calm["best"] == "d" and not calm["busy"] and machine.settled(calm)
    unknown = machine.quietest({"best": "e", "others_cpu_share": None}, None)
    assert not unknown["busy"] and machine.settled(unknown)


def test_a_shape_timed_under_load_is_timed_again_at_the_next_run(monkeypatch, capsys):
    """The failure this guards against: a quick sweep under load 4-7 turned the draft off, and that
    verdict was cached for good although the chain was 1.57x faster on the quiet machine (the
    AVX-512 + avx512_bf16 EPYC, benchmarks/README.md)."""
    loads = [0.7, 0.05]  # others' share during the first and the second quick sweep
    verdicts = [False, True]  # under load nothing beat the target alone; quiet, the chain did

    def fake_sweep(*args, **kwargs):
        return {"best": {"draft_tokens": 2}, "best_tokens_per_s": 10.0, "target_tokens_per_s": 9.0,
                "beats_target": verdicts.pop(0), "ngram_tokens": 0, "best_chain": 2, "best_tree": [3, 4, 8],
                "results": [], "others_cpu_share": loads.pop(0), "prompts": 1}

    monkeypatch.setattr(sweep_module, "sweep_shapes", fake_sweep)
    target = SimpleNamespace(name="tiny", device=torch.device("cpu"))  # the quick sweep names its device
    monkeypatch.setattr(generate_module, "measure_shape", lambda t, d, drafter, dtype, previous=None, **kw:
                        sweep_module.quick_sweep(t, d, drafter, dtype, [[1]], [], ngram_tokens=0, previous=previous))
    models = (target, object())
    shape, source = choose_shape("tiny", "draft", torch.float32, None, None, models=models)
    assert shape == {} and source == generate_module.TARGET_ALONE  # used now: the draft is off for this run
    assert "timed again at the next run (attempt 1 of 3)" in capsys.readouterr().err
    assert needs_sweep(read_best_shape("tiny", "draft", torch.float32))
    shape, source = choose_shape("tiny", "draft", torch.float32, None, None, models=models)
    assert shape == {"draft_tokens": 2} and source == MEASURED_AGAIN
    entry = read_best_shape("tiny", "draft", torch.float32)
    assert not needs_sweep(entry) and entry["attempts"] == 2 and entry["others_cpu_share"] == 0.05
    assert choose_shape("tiny", "draft", torch.float32, None, None, models=models) == ({"draft_tokens": 2}, "sweep cache")


def test_a_dtype_timed_under_load_serves_the_run_and_is_timed_again_at_the_next(monkeypatch, capsys):
    from eyas import dtype_choice

    calls = []
    monkeypatch.setattr(dtype_choice, "measure_dtypes", fake_dtype_measurement(calls, "bf16"))
    monkeypatch.setattr(dtype_choice, "_THIS_RUN", {})
    monkeypatch.setattr(dtype_choice, "_key", lambda target: ["tiny", "this machine"])
    # others keep every core busy during the first timing, none during the second
    fake_clock(monkeypatch, [(0.0, 100.0), (100.0, 200.0), (100.0, 200.0), (110.0, 300.0)], [0.0, 0.0, 0.0, 10.0])
    assert dtype_choice.resolve_dtype("auto", None) == (torch.bfloat16, "auto: measured on this machine")
    assert dtype_choice.hf_dtypes("auto", None)["hf_greedy"][0] == torch.bfloat16  # the same run: not timed again
    assert len(calls) == 1 and "attempt 1 of 3" in capsys.readouterr().err
    monkeypatch.setattr(dtype_choice, "_THIS_RUN", {})  # the next run
    dtype_choice.resolve_dtype("auto", None)
    assert len(calls) == 2 and "attempt" not in capsys.readouterr().err
    assert dtype_choice.resolve_dtype("auto", None)[1] == "auto: measured on this machine (cached)" and len(calls) == 2


GOOD_SHAPE = {"best": {"draft_tokens": 2}, "best_chain": 2, "best_tree": [3, 4, 8], "beats_target": True,
              "ngram_tokens": 4, "best_chain_ngram": 2, "busy": False, "attempts": 1, "others_cpu_share": 0.1}


@pytest.mark.parametrize("edit", [
    {"best": {"draft_tokens": 2, "tree": [3, 4, 8]}}, {"best": {"draft_tokens": 2.5}}, {"best": {"draft_tokens": 500}},
    {"best": {"draft_tokens": True}}, {"best": {"draft_tokens": 2, "ngram_tokens": "x"}}, {"best": {"tree": [3, 4, 2]}},
    {"best": {"draft_tokens": 2, "colour": 1}}, {"best_chain": 0}, {"best_tree": "3,4,8"}, {"best_chain_ngram": "x"},
    {"ngram_tokens": None}, {"beats_target": "yes"}, {"busy": "yes"}, {"attempts": "x"}, {"attempts": 0},
    {"others_cpu_share": "x"}, {"others_cpu_share": 7.0},
])
def test_a_shape_entry_edited_out_of_shape_is_measured_again_never_half_used(edit):
    """Each field a run reads, wrong: the entry is ignored (the next run sweeps), not a traceback mid-decode
    (a missing ngram_tokens was a KeyError in bench, a string one a TypeError in decode)."""
    from eyas.draft_shape import save_best_shape

    save_best_shape("tiny", "draft", torch.float32, GOOD_SHAPE)
    assert read_best_shape("tiny", "draft", torch.float32) == GOOD_SHAPE
    save_best_shape("tiny", "draft", torch.float32, {**GOOD_SHAPE, **edit})
    assert read_best_shape("tiny", "draft", torch.float32) is None
    bare = {k: v for k, v in GOOD_SHAPE.items() if k != "ngram_tokens"}  # the sweep's default branch is read too
    save_best_shape("tiny", "draft", torch.float32, bare)
    assert read_best_shape("tiny", "draft", torch.float32) is None


def test_a_cache_folder_that_cannot_be_written_is_a_warning_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    from eyas import dtype_choice

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    calls = []
    monkeypatch.setattr(dtype_choice, "measure_dtypes", fake_dtype_measurement(calls, "bf16"))
    monkeypatch.setattr(dtype_choice, "_THIS_RUN", {})
    monkeypatch.setattr(dtype_choice, "_key", lambda target: ["tiny", "this machine"])
    with pytest.warns(UserWarning, match="cannot record the dtype measurement in .*file/eyas/fastest_dtype.json"):
        assert dtype_choice.resolve_dtype("auto", None) == (torch.bfloat16, "auto: measured on this machine")
    assert "cached in" not in capsys.readouterr().err and len(calls) == 1


def test_a_sweep_times_the_dtype_anew_and_the_run_uses_that_timing(monkeypatch, tmp_path):
    """A timing kept after three busy attempts says to re-measure with `eyas bench --sweep`: that times the
    dtypes again (once for the run: the baselines' dtypes come from the same timing)."""
    from eyas import dtype_choice

    # the timing is faked: any target keys it (converting the default took 24 s on a 2-core AVX2 EPYC)
    target = _stand_in_target(tmp_path)
    calls = []
    monkeypatch.setattr(dtype_choice, "_THIS_RUN", {})
    monkeypatch.setattr(dtype_choice, "measure_dtypes", fake_dtype_measurement(calls, "bf16"))
    dtype_choice.resolve_dtype("auto", target)
    assert dtype_choice.resolve_dtype("auto", target)[1].endswith("(cached)") and len(calls) == 1
    monkeypatch.setattr(dtype_choice, "measure_dtypes", fake_dtype_measurement(calls, "fp32"))
    assert dtype_choice.resolve_dtype("auto", target, again=True) == (torch.float32, "auto: measured on this machine")
    assert dtype_choice.hf_dtypes("auto", target)["hf_greedy"][1] == "auto: measured on this machine"
    assert len(calls) == 2
    monkeypatch.setattr(dtype_choice, "_THIS_RUN", {})  # the next run reads the new timing
    assert dtype_choice.resolve_dtype("auto", target) == (torch.float32, "auto: measured on this machine (cached)")


def _stand_in_target(tmp_path: Path) -> Path:
    """A folder the dtype timing's key reads (config.json and a weights file), never loaded."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    (target / "model.safetensors").write_bytes(b"weights")
    return target


def _rewrite(weights: Path) -> None:
    """The file's modification time moved, as weights written anew there have."""
    import os

    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_a_model_written_anew_into_its_folder_is_measured_again(tmp_path):
    """The shape cache was keyed by the draft's path alone, and both caches by the target's: a retrained draft,
    or another model copied over the target, kept the old one's verdict."""
    from eyas.draft_shape import save_best_shape

    draft, target = tmp_path / "draft", tmp_path / "target"
    for folder in (draft, target):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"weights")
    save_best_shape(str(target), draft, torch.float32, GOOD_SHAPE)
    assert read_best_shape(str(target), draft, torch.float32) == GOOD_SHAPE
    _rewrite(draft / "model.safetensors")
    assert read_best_shape(str(target), draft, torch.float32) is None
    save_best_shape(str(target), draft, torch.float32, GOOD_SHAPE)
    _rewrite(target / "model.safetensors")
    assert read_best_shape(str(target), draft, torch.float32) is None


def test_the_dtype_timing_is_keyed_by_the_targets_weights(tmp_path):
    from eyas.dtype_choice import _key

    target = _stand_in_target(tmp_path)
    before = _key(target)
    assert _key(target) == before and before[1] == [["model.safetensors", 7, (target / "model.safetensors")
                                                     .stat().st_mtime_ns]]
    _rewrite(target / "model.safetensors")
    assert _key(target) != before
