"""Targets whose class maps lm_head's output (Gemma 2's softcapping, Granite's and Cohere's scales) run, with
the logits their class computes: every verb that loaded one refused it before, Gemma 2 (final_logit_softcapping
30) among them, and training's labels read plain lm_head products.

Each family of eyas.logit_map.FAMILIES is probed against transformers' own class: a tiny random model with the
field set to a value that moves the logits, its forward's logits against eyas's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from test_data import save_tiny_target
from test_decode import SAMPLING_TARGET, chi_square_pvalue, random_drafter, sample_runs, small_contract

from eyas.cli import main
from eyas.decode.sampling import Sampling
from eyas.errors import FormatError
from eyas.logit_map import FAMILIES, LogitMap, logit_map
from eyas.sampled import target_probs
from eyas.target import Target
from eyas.target_ref import TargetRef
from eyas.train import loss
from eyas.train.loss import target_probs as label_probs

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=False,
            eos_token_id=2, pad_token_id=0, bos_token_id=None)
# values that move tiny random logits (|logits| ~ 10): a cap of 0.7 bends them all, a scale of 3 or 1/4 too
VALUES = {"final_logit_softcapping": 0.7, "logits_scaling": 3.0, "logit_scale": 0.25}
# what a family's tiny config needs beside TEXT
EXTRA = {
    "gemma3n_text": dict(vocab_size_per_layer_input=48, hidden_size_per_layer_input=8, laurel_rank=4,
                         altup_num_inputs=2, num_kv_shared_layers=0, intermediate_size=[64, 64],
                         activation_sparsity_pattern=[0.0, 0.0], layer_types=["sliding_attention", "full_attention"]),
    "granitemoehybrid": dict(mamba_n_heads=4, mamba_d_head=16, mamba_expand=2, mamba_n_groups=1,
                             layer_types=["mamba", "attention"]),
    "minicpm3": dict(num_key_value_heads=4, dim_model_base=8, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
                     qk_rope_head_dim=8, v_head_dim=8),  # logits_scaling: a property, hidden_size / dim_model_base
}
IMAGE_TEXT = {"gemma4": "gemma4_text", "hyperclovax_vision_v2": "hyperclovax"}  # their language model's type
SMALL_VISION = {"hyperclovax_vision_v2": {  # its default vision tower takes two minutes to build
    "model_type": "qwen2_5_vl_vision", "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
    "out_hidden_size": 32, "patch_size": 14, "window_size": 28, "fullatt_block_indexes": [0]}}
# in the table from transformers' source, not built here: Gemma 3n's vision tower needs timm, Cohere Compass's
# rotary module and Granite 4 Vision's projector need configs no tiny one gives them
UNBUILT = {"gemma3n", "cohere_compass", "cohere_compass_text", "granite4_vision"}


def _model(family: str) -> torch.nn.Module:
    """A tiny random model of `family`, its logit fields set to VALUES."""
    assert UNBUILT <= set(FAMILIES)  # a family said unbuilt names one in the table
    fields = {name: VALUES[name] for name, _ in FAMILIES[family] if family != "minicpm3"}
    if family in IMAGE_TEXT:
        vision = {"vision_config": SMALL_VISION[family]} if family in SMALL_VISION else {}
        config = transformers.AutoConfig.for_model(family, text_config={**TEXT, "model_type": IMAGE_TEXT[family],
                                                                         **fields}, **vision)
        model = transformers.AutoModelForImageTextToText.from_config(config)
    else:
        config = transformers.AutoConfig.for_model(family, **{**TEXT, **EXTRA.get(family, {}), **fields})
        model = transformers.AutoModelForCausalLM.from_config(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - UNBUILT))  # UNBUILT: in the table, so a stale name fails
def test_the_logits_are_what_the_targets_own_class_computes(family):
    model = _model(family)
    target = Target(model, None, Path("/tiny"), family)
    assert not target.logit_map.identity
    ids = torch.randint(3, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    ours, theirs = target.forward(ids, ()).logits, model(input_ids=ids).logits
    raw = model.get_output_embeddings()(target.forward(ids, (), with_logits=False).last_hidden)
    assert (raw - theirs).abs().max() > 0.1  # the map moves them: without it eyas was this far off
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)  # MiniCPM3 divides the state, not the logits


@pytest.mark.parametrize("family,applied", [("gemma3", False), ("gemma4", True)])
def test_an_image_text_class_decides_not_its_language_models(family, applied):
    """Gemma 3's image-text class applies no softcapping where its text class would; Gemma 4's does."""
    text = {**TEXT, "model_type": f"{family}_text", "final_logit_softcapping": 0.7}
    config = transformers.AutoConfig.for_model(family, text_config=text)
    model = transformers.AutoModelForImageTextToText.from_config(config)
    target = Target(model, None, Path("/tiny"), family)
    assert target.logit_map.identity is not applied
    ids = torch.randint(3, 40, (1, 5))
    torch.testing.assert_close(target.forward(ids, ()).logits, model(input_ids=ids).logits)


def test_a_field_the_class_does_not_read_changes_nothing():
    """Llama's class ignores final_logit_softcapping: a config that carries it keeps plain lm_head logits."""
    assert logit_map("llama", {"final_logit_softcapping": 30.0, "logit_scale": 0.5}).identity
    assert logit_map("granite", {"logits_scaling": 8}) == LogitMap(divisor=8.0)
    assert logit_map("hyperclovax", {"logits_scaling": 8}) == LogitMap(multiplier=8.0)  # the same field, the other way
    assert logit_map("gemma2", {"final_logit_softcapping": None}).identity


@pytest.mark.parametrize("value", [0, -0.5, "30", True, float("nan")])
def test_a_value_the_class_cannot_use_is_refused_naming_the_field(value):
    with pytest.raises(FormatError, match=rf"config.json: logit_scale is {value!r}; a cohere target's logits need"):
        logit_map("cohere", {"logit_scale": value})


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory) -> Path:
    """A tiny Gemma 2 saved as transformers writes it (softcapping at 0.7), with the tiny target's chat tokenizer."""
    root = tmp_path_factory.mktemp("gemma2")
    chat = save_tiny_target(root / "chat")
    folder = root / "gemma2"
    folder.mkdir()
    for f in chat.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, folder / f.name)
    config = transformers.Gemma2Config(**{**TEXT, "num_hidden_layers": 4, "eos_token_id": 1},
                                       final_logit_softcapping=0.7, sliding_window=8)
    torch.manual_seed(0)
    transformers.Gemma2ForCausalLM(config).save_pretrained(folder)
    return folder


def test_the_head_read_alone_gives_the_targets_distribution(gemma2):
    """eval --temperature on a cache and training's labels: softmax of the class's logits, not lm_head's."""
    model = transformers.Gemma2ForCausalLM.from_pretrained(gemma2)
    head = TargetRef.resolve(gemma2).head()
    assert head.logit_map == LogitMap(softcap=0.7)
    ids = torch.randint(3, 40, (1, 9))
    last = Target.load(gemma2).forward(ids, ()).last_hidden[0]  # [T, H], final-normed
    logits = model(input_ids=ids).logits[0]
    cols = torch.tensor([1, 5, 9, 30])
    torch.testing.assert_close(target_probs(last, head.lm_head, 0.7, cols, head.logit_map),
                               (logits / 0.7).softmax(-1)[:, cols])
    p, in_vocab = label_probs(last[None], head.lm_head, cols, logit_map=head.logit_map)
    torch.testing.assert_close(p[0], logits[:, cols].softmax(-1))
    assert not torch.allclose(label_probs(last[None], head.lm_head, cols)[0][0], p[0])  # unmapped: other labels


def test_a_gemma2_target_runs_from_the_command_line(gemma2, tmp_path, capsys, monkeypatch):
    """Every verb that loaded a softcapped target refused it; now they run, sampled measures included, and
    training's labels read the softcapped logits."""
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(gemma2), "--capture-layers", "1,2,4"]) == 0
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nthe cat sat\n")
    assert main(["generate", str(draft), "--target", str(gemma2), "--prompt", "hello there", "--max-new-tokens",
                 "8", "--draft-tokens", "3", "--temperature", "0.8", "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["eval", str(draft), "--target", str(gemma2), "--prompts", str(prompts), "--max-new-tokens", "8",
                 "--temperature", "0.7", "--json", "--no-progress"]) == 0
    assert "sampled" in json.loads(capsys.readouterr().out)
    assert main(["capture", "--target", str(gemma2), "--prompts", str(prompts), "--out", str(tmp_path / "cap"),
                 "--capture-layers", "1,2,4", "--max-new-tokens", "6", "--no-progress"]) == 0
    maps = []

    def recording(*args, logit_map, **kwargs):
        maps.append(logit_map)
        return label_probs(*args, logit_map=logit_map, **kwargs)

    monkeypatch.setattr(loss, "target_probs", recording)
    assert main(["train", "--data", str(tmp_path / "cap"), "--target", str(gemma2), "--out", str(tmp_path / "run"),
                 "--max-steps", "2", "--batch-tokens", "32", "--dtype", "fp32", "--no-progress"]) == 0
    assert maps and set(maps) == {LogitMap(softcap=0.7)}


def test_a_bad_value_is_refused_before_loading(gemma2, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(gemma2, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": -30.0}))
    with pytest.raises(FormatError, match="final_logit_softcapping is -30.0"):
        TargetRef.resolve(bad).logit_map()
    assert main(["generate", "--target", str(bad), "--prompt", "hello", "--max-new-tokens", "4"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --target {bad}: final_logit_softcapping is -30.0")


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> Target:
    """The sampling target of tests/test_decode.py as a Gemma 2 whose softcapping bends its distribution (cap 1)."""
    folder = tmp_path_factory.mktemp("capped")
    torch.manual_seed(1)
    transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **SAMPLING_TARGET, initializer_range=0.3, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, final_logit_softcapping=1.0)).save_pretrained(folder)
    return Target.load(folder)


def test_sampling_a_softcapped_target_follows_its_distribution(capped, monkeypatch):
    """Speculative sampling against the class's own softmax (the test's expected counts come from the model's
    forward); the same sampler fed plain lm_head logits is caught by the same check."""
    s = Sampling(1.0)
    drafter = random_drafter(capped, small_contract(), seed=2)
    samples = sample_runs(capped, drafter, {"draft_tokens": 3}, s)
    assert chi_square_pvalue(samples, capped, s) > 0.001
    monkeypatch.setattr(capped, "logit_map", LogitMap())  # eyas before: logits as lm_head wrote them
    assert chi_square_pvalue(sample_runs(capped, drafter, {"draft_tokens": 3}, s), capped, s) < 0.001
