"""Bad draft checkpoints, fuzzed: mutated configs and safetensors headers never crash eyas.

Every case copies a valid tiny draft (both on-disk formats), mutates one thing (a config value's
type, a missing key, a wrong-length list, a huge or negative number, bad UTF-8, truncation; a
safetensors header's length prefix, JSON, dtype, shape or offsets; the file cut short), then runs
inspect, check, convert and eval on it through `eyas.cli.main`. Whatever the mutation, eyas either
accepts the input (a mutation can be harmless) or refuses it the documented way: exit 2, exactly
one `error:` line that names the file it could not use, no traceback (no exception leaves `main`),
nothing written, the input untouched. `check` may also exit 1 (problems found, as a report).
The run verbs' other inputs are fuzzed in tests/test_fuzz_inputs.py; what both share is in
tests/fuzzing.py.

Hypothesis runs derandomized, so CI sees the same few hundred cases on every machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file, save

from fuzzing import (FORMATS, FUZZ, assert_handled, config_mutation, digest, run_main, safetensors_mutation,
                     world)  # noqa: F401 (world: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


# --- running eyas on a mutated copy ------------------------------------------------------------------


def _mutated_copy(world: dict, fmt: str, case: Path, file: str, data: bytes) -> Path:
    if case.exists():
        shutil.rmtree(case)
    shutil.copytree(world[fmt], case)
    (case / file).write_bytes(data)
    return case


def _exercise(world: dict, case: Path, file: str, capsys) -> None:
    before = digest(case)
    for argv, ok in (
        (["inspect", str(case), "--json"], (0, 1)),
        (["check", str(case), "--json", "--target", str(world["target"])], (0, 1)),
        (["eval", str(case), "--target", str(world["target"]), "--data", str(world["shards"]), "--json",
          "--depth", "2", "--dtype", "fp32", "--no-progress"], (0,)),
    ):
        rc, out, err = run_main(argv, capsys)
        assert_handled(rc, err, ok, file, argv)
        if rc in (0, 1):
            json.loads(out)
    dst = case.parent / f"{case.name}-converted"
    shutil.rmtree(dst, ignore_errors=True)
    argv = ["convert", str(case), str(dst), "--format", "eagle"]
    rc, _, err = run_main(argv, capsys)
    assert_handled(rc, err, (0,), file, argv)
    if rc != 0:
        assert not dst.exists(), "a refused convert left its output behind"
    leftovers = [p.name for p in case.parent.iterdir() if p.name.startswith(".")]
    assert not leftovers, f"temp files left behind: {leftovers}"
    assert digest(case) == before, "the input was modified"


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_mutated_configs_are_read_or_refused_cleanly(world, fmt, data, capsys):
    cfg = json.loads((world[fmt] / "config.json").read_text())
    mutated = data.draw(config_mutation(cfg))
    case = _mutated_copy(world, fmt, world["root"] / f"case-{fmt}", "config.json", mutated)
    _exercise(world, case, "config.json", capsys)


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_mutated_safetensors_are_read_or_refused_cleanly(world, fmt, data, capsys):
    raw = (world[fmt] / "model.safetensors").read_bytes()
    mutated = data.draw(safetensors_mutation(raw))
    case = _mutated_copy(world, fmt, world["root"] / f"case-st-{fmt}", "model.safetensors", mutated)
    _exercise(world, case, "model.safetensors", capsys)


@pytest.mark.parametrize("name", ["layers.0.hidden_norm.weight", "fc.weight"])
def test_a_vector_stored_as_a_matrix_and_back_is_a_finding(world, capsys, name):
    """A norm weight saved as [1, H] (unsqueezed by some exporter), or a matrix flattened: a shape
    finding, never an IndexError while explaining it."""
    t = load_file(world["speculators"] / "model.safetensors")
    t[name] = t[name].unsqueeze(0).contiguous() if t[name].ndim == 1 else t[name].flatten().contiguous()
    case = _mutated_copy(world, "speculators", world["root"] / f"reshaped-{name}", "model.safetensors",
                         save(t))
    _exercise(world, case, "model.safetensors", capsys)
    rc, out, _ = run_main(["check", str(case), "--json"], capsys)
    assert rc == 1 and any(p["code"].endswith("shape") and name in p["problem"] for p in json.loads(out)["problems"])


def test_the_fuzzer_reaches_both_outcomes(world, capsys):
    """The cases above are not all harmless: a known-bad and a known-good input behave as documented."""
    case = _mutated_copy(world, "eagle", world["root"] / "sanity", "model.safetensors", b"\x00" * 5)
    rc, _, err = run_main(["inspect", str(case)], capsys)
    assert rc == 2 and "model.safetensors" in err
    assert run_main(["inspect", str(world["eagle"])], capsys)[0] == 0


@pytest.mark.parametrize(
    ("edit", "also"),
    [
        (lambda c: c.update(hidden_act="tanh"), "hidden_act"),  # read fine; the drafter implements no tanh
        (lambda c: c.update(rope_scaling={"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}),
         "longrope"),
        (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 9]), "does not fit"),  # past the target
        (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]), "manifest.json"),  # not the data's
    ],
)
def test_errors_found_after_reading_name_the_config(world, capsys, edit, also):
    """What only the drafter, the target or the data can refuse still names the draft's config file."""
    cfg = json.loads((world["eagle"] / "config.json").read_text())
    edit(cfg)
    case = _mutated_copy(world, "eagle", world["root"] / "after-reading", "config.json", json.dumps(cfg).encode())
    common = ["--target", str(world["target"]), "--data", str(world["shards"]), "--dtype", "fp32", "--no-progress"]
    for drafts in ([str(case)], [str(world["eagle"]), "--against", str(case)]):  # the draft, or the one compared
        rc, _, err = run_main(["eval", *drafts, *common], capsys)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert rc == 2 and len(errors) == 1, err
        assert str(case / "config.json") in errors[0], errors[0]
        assert also in errors[0] or drafts[1:] and "capture layers [1, 2, 3]" in errors[0], errors[0]
