"""Real targets: a target named once (TargetRef), judged from its final norm and lm_head alone, on any
device, refused before loading when it cannot fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import eyas.weights as weights_mod
from eyas.cli import main
from eyas.data import capture
from eyas.data.caches import NORMED
from eyas.devices import on_gpu, parse_device
from eyas.dtypes import short_name
from eyas.errors import EyasError
from eyas.engines.predict import predict
from eyas.evaluate import eval_dtype, target_greedy
from eyas.target import Target
from eyas.target_ref import TargetRef
from eyas.verdict import describe
from test_data import CROSS, LAYERS, PROMPTS, save_tiny_target
from test_evaluate import tiny  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The tiny target re-saved in many small shards (as real targets are), with eyas's capture of it
    and a random draft for it."""
    from transformers import LlamaForCausalLM

    plain = save_tiny_target(tmp_path_factory.mktemp("plain"))
    folder = tmp_path_factory.mktemp("sharded")
    LlamaForCausalLM.from_pretrained(plain).save_pretrained(folder, max_shard_size="20KB")
    for f in plain.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, folder / f.name)
    shards = tmp_path_factory.mktemp("shards") / "s"
    capture(Target.load(folder), PROMPTS, LAYERS, shards, max_new_tokens=12, batch_size=2, dtype="float32",
            progress=False)
    draft = tmp_path_factory.mktemp("draft") / "d"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", ",".join(map(str, LAYERS))]) == 0
    return folder, shards, draft


def test_eval_on_stored_features_reads_only_the_final_norm_lm_head_and_embeddings(sharded, monkeypatch, capsys):
    folder, shards, draft = sharded
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 3 and any(n.startswith("model.layers.3.") for n in index)
    opened: list[tuple[str, frozenset]] = []
    read_file = weights_mod._read_file

    def spy(path, names):
        opened.append((path.name, frozenset(names or ())))
        return read_file(path, names)

    monkeypatch.setattr(weights_mod, "_read_file", spy)
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(shards), "--target", str(folder), "--json", "--depth", "3",
                 "--dtype", "fp32", "--no-progress"]) == 0
    rep = json.loads(capsys.readouterr().out)
    wanted = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}  # the draft ships no embeddings
    assert set(rep["cost"]["target_tensors_read"]) == wanted
    target_reads = [(f, n) for f, n in opened if f != "model.safetensors"]  # the draft's own file aside
    assert set().union(*(n for _, n in target_reads)) == wanted
    assert {f for f, _ in target_reads} == {index[n] for n in wanted}  # only the shards holding them
    assert rep["data"]["format"] == "eyas" and rep["data"]["verdict"] == "target"
    assert rep["cost"]["positions_per_s"] > 0 and rep["tokens"] > 0


def test_a_draft_with_its_own_embeddings_reads_only_the_final_norm_and_lm_head(sharded, tmp_path, capsys):
    from dataclasses import replace

    from eyas.formats import read_checkpoint, write_checkpoint

    folder, shards, draft = sharded
    ckpt = read_checkpoint(draft)
    tensors = {**ckpt.tensors, "embed_tokens.weight": TargetRef.resolve(folder).embeddings()}
    own = write_checkpoint(tmp_path / "own", replace(ckpt.contract, has_embeddings=True), tensors, "speculators")
    capsys.readouterr()
    assert main(["eval", str(own), "--data", str(shards), "--target", str(folder), "--json", "--depth", "2",
                 "--no-progress"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["cost"]["target_tensors_read"]) == [
        "lm_head.weight", "model.norm.weight"]


@pytest.mark.parametrize("keep_index", [True, False])
def test_verbs_that_answer_prompts_refuse_a_head_only_target_before_loading(sharded, tmp_path, capsys, keep_index):
    """A folder with the final norm and lm_head judges a cache; answering prompts with it used to load a
    model filled at random (transformers' MISSING report), or to measure nothing and say "ok"."""
    folder, shards, draft = sharded
    head = tmp_path / "head"
    head.mkdir()
    for f in folder.iterdir():
        if not f.name.startswith("model"):
            shutil.copy(f, head / f.name)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    wanted = {index[n] for n in ("model.norm.weight", "lm_head.weight", "model.embed_tokens.weight")}
    if keep_index:  # the other shards absent
        shutil.copy(folder / "model.safetensors.index.json", head)
        for shard in wanted:
            shutil.copy(folder / shard, head / shard)
    else:
        names = ["model.norm.weight", "lm_head.weight", "model.embed_tokens.weight"]
        tensors = TargetRef.resolve(folder).tensors(names)
        save_file(tensors, str(head / "model.safetensors"))
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\nhow are you\n")
    capsys.readouterr()
    for argv in (["eval", str(draft), "--prompts", str(prompts)], ["doctor", str(draft), "--prompts", str(prompts)],
                 ["generate", str(draft), "--prompt", "hi"], ["bench", str(draft), "--limit", "1"]):
        assert main([*argv, "--target", str(head)]) == 2, argv
        err = capsys.readouterr().err
        why = "lacks " if keep_index else "no decoder layer"
        assert why in err and err.count("\n") == 2 and "LOAD REPORT" not in err, err
    assert main(["eval", str(draft), "--data", str(shards), "--target", str(head), "--json", "--no-progress"]) == 0


def test_the_verdict_from_the_head_equals_the_full_target(sharded):
    folder, shards, _ = sharded
    ref = TargetRef.resolve(folder)
    head = ref.head(torch.float32)
    tgt = Target.load(ref)
    ids = torch.tensor([[1, 5, 9, 12, 7, 3]])
    out = tgt.forward(ids, [4])  # index N = the last layer's output, before the final norm
    # a state stored before the final norm (speculators/vLLM), normed as eval's verdict does
    assert torch.equal(target_greedy({"last_hidden": head.normalize(out.features[0])}, head.lm_head),
                       out.logits[0].argmax(-1))
    assert torch.allclose(out.last_hidden[0] @ head.lm_head.T, out.logits[0], atol=1e-5)


@pytest.mark.parametrize("layout", ["model.language_model.", "language_model.model."])
def test_a_multimodal_targets_head_is_read_under_its_language_model(sharded, tmp_path, capsys, layout):
    """Llama 4, Gemma 3, Mistral 3 hold the language model's tensors under a prefix (transformers' current
    layout, or the older one with `language_model.lm_head`): the head is read there, the same figures."""
    folder, shards, draft = sharded
    ref = TargetRef.resolve(folder)
    lm = "lm_head.weight" if layout.startswith("model.") else "language_model.lm_head.weight"
    mm = tmp_path / "mm"
    mm.mkdir()
    renamed = {layout + n.removeprefix("model.") if n.startswith("model.") else lm: t
               for n, t in ref.tensors(sorted(ref.tensor_names())).items()}
    save_file({**renamed, "vision_tower.patch.weight": torch.zeros(2, 2)}, mm / "model.safetensors")
    (mm / "config.json").write_text(json.dumps({"architectures": ["Llama4ForConditionalGeneration"],
                                                "model_type": "llama4", "text_config": ref.text_config}))
    capsys.readouterr()
    flags = ["--data", str(shards), "--json", "--depth", "3", "--dtype", "fp32", "--no-progress"]
    assert main(["eval", str(draft), "--target", str(folder), *flags]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["eval", str(draft), "--target", str(mm), *flags]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert sorted(rep["cost"]["target_tensors_read"]) == sorted([layout + "embed_tokens.weight", layout + "norm.weight",
                                                                 lm])
    assert (rep["tau_chain"], rep["acceptance_by_depth"]) == (plain["tau_chain"], plain["acceptance_by_depth"])
    assert "final norm's digest matches" in " ".join(rep["stderr_warnings"])  # the same weights, recognised


def test_a_ref_resolves_once_and_passes_through(sharded):
    folder = sharded[0]
    ref = TargetRef.resolve(folder)
    assert TargetRef.resolve(ref) is ref
    assert ref.num_layers == 4 and ref.hidden_size == 32 and ref.vocab_size == 48 and not ref.tied_embeddings()
    assert ref.name == str(folder.resolve())
    assert TargetRef.resolve(str(folder / "config.json")).path == folder


def test_init_refuses_default_capture_layers_a_small_target_cannot_have(tmp_path, capsys):
    """(2, N//2, N-3) for 6 layers is [2, 3, 3]: a draft written with it is refused by every loader."""
    from test_target import save_tiny

    folder = save_tiny(tmp_path / "six")
    assert main(["init", str(tmp_path / "draft"), "--target", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "[2, 3, 3]" in err and "--capture-layers" in err and "Traceback" not in err
    assert not (tmp_path / "draft").exists()


def test_a_tied_head_and_the_borrowed_embeddings_are_read_once_in_any_dtype(tmp_path):
    """A draft without embeddings borrows the target's; a tied lm_head is the same matrix. Run in
    another dtype than stored, both get the one converted copy (for a 128k x 8192 target, 2 GB read once)."""
    from eyas.drafter_loading import load_drafter_and_config
    from test_target import save_tiny

    folder = save_tiny(tmp_path / "tied", tie_word_embeddings=True)  # stored in fp32
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", "1,3,5"]) == 0
    ref = TargetRef.resolve(folder, dtype=torch.bfloat16)
    drafter, _ = load_drafter_and_config(draft, target=ref, dtype=torch.bfloat16)
    head = ref.head()
    assert head.lm_head is drafter.embed_tokens.weight and head.lm_head.dtype == torch.bfloat16
    assert ref.read == ["model.embed_tokens.weight", "model.norm.weight"]
    assert ref.tensors(["embed_tokens.weight"])["embed_tokens.weight"].dtype == torch.float32  # as stored
    assert ref.read.count("model.embed_tokens.weight") == 2  # nothing held the stored copy: read again


@pytest.mark.parametrize("verb", [
    ["eval", "--data", "SHARDS"], ["doctor"], ["generate", "--prompt", "hi"], ["bench", "--limit", "1"],
    ["capture", "--out", "OUT", "--limit", "1"], ["serve-check", "--limit", "1"],
])
def test_device_cuda_without_a_gpu_is_one_line_before_anything_loads(sharded, tmp_path, monkeypatch, capsys, verb):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    folder, shards, draft = sharded

    def never(*a, **k):
        raise AssertionError("the target was loaded before --device was checked")

    monkeypatch.setattr(Target, "load", never)
    args = [a.replace("SHARDS", str(shards)).replace("OUT", str(tmp_path / "out")) for a in verb]
    positional = [] if verb[0] == "capture" else [str(draft)]
    assert main([verb[0], *positional, *args[1:], "--target", str(folder), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device cuda: no CUDA GPU") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_the_parser_names_every_cache_format_the_readers_read():
    from eyas.cli.parser import CACHE_FORMATS as named
    from eyas.data.caches import CACHE_FORMATS as read

    assert named == read


def test_parse_device():
    assert parse_device(None) == parse_device("CPU") == parse_device("cpu:3") == torch.device("cpu")
    with pytest.raises(EyasError, match="not a device"):
        parse_device("gpu0")
    with pytest.raises(EyasError, match="cpu or cuda"):
        parse_device("meta")
    with pytest.raises(EyasError, match="--device is empty"):  # not read as the default
        parse_device(" ")
    # read the same way where a dtype is chosen for it: `--device CPU` crashed eval/generate/bench under
    # --dtype auto in torch.device (eyas.devices.on_gpu)
    assert not on_gpu("CPU") and not on_gpu(" cpu") and not on_gpu(None)
    assert eval_dtype("auto", " CPU ") == eval_dtype("auto", "cpu")


def test_a_target_too_large_for_memory_is_refused_before_loading(sharded, monkeypatch):
    import eyas.devices as devices

    monkeypatch.setattr(devices, "free_bytes", lambda device: 1000)
    monkeypatch.setattr("eyas.target.free_bytes", lambda device: 1000)
    with pytest.raises(EyasError, match=r"target .* in fp32 needs about .* KiB of weights.* free memory is 1.0 KiB"):
        Target.load(sharded[0])


def test_capture_loads_the_target_onto_its_device_before_writing(sharded, tmp_path, monkeypatch, capsys):
    """`eyas capture --device D` loads the target for D (refused when it does not fit there, spread over
    GPUs by `cuda`), never on the host and then moved: nothing is written when it is refused."""
    import eyas.target

    folder = sharded[0]
    (tmp_path / "p.txt").write_text("hello there\n")
    asked = []
    real = eyas.target.Target.load.__func__
    monkeypatch.setattr(eyas.target.Target, "load",
                        classmethod(lambda cls, spec, **kw: asked.append(kw.get("device")) or real(cls, spec, **kw)))
    monkeypatch.setattr("eyas.devices.free_bytes", lambda device: 1000)
    argv = ["capture", "--target", str(folder), "--prompts", str(tmp_path / "p.txt"), "--out", str(tmp_path / "o"),
            "--device", "cpu", "--max-new-tokens", "2", "--no-progress", "--capture-layers", ",".join(map(str, LAYERS))]
    assert main(argv) == 2 and asked == ["cpu"]
    assert "needs about" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_a_draft_too_large_for_memory_is_refused_before_reading(sharded, monkeypatch, capsys):
    import eyas.devices as devices

    folder, shards, draft = sharded
    monkeypatch.setattr(devices, "free_bytes", lambda device: 1000)
    assert main(["eval", str(draft), "--data", str(shards), "--target", str(folder)]) == 2
    err = capsys.readouterr().err
    dtype = short_name(eval_dtype("auto", None))  # bf16 where the CPU has bf16 dot products, fp32 on AVX2 alone
    assert err.startswith(f"error: draft {draft} in {dtype} needs about") and "free memory" in err


# --- other trainers' caches: the same verdict as eyas's own capture --------------------------------


@pytest.fixture(scope="module")
def plain(tiny, tmp_path_factory):
    """The tiny target (one file) and eyas's capture of it at LAYERS (test_evaluate's), the rows of that
    capture, and a random draft for it."""
    from eyas.data import open_shards

    folder, shards = tiny
    rows = [(s["input_ids"], s["loss_mask"].long()) for s in open_shards(shards)]
    draft = tmp_path_factory.mktemp("plain-draft") / "d"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", ",".join(map(str, LAYERS))]) == 0
    return folder, shards, rows, draft


def _eval(draft, data, folder, capsys, *extra) -> dict:
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(data), "--target", str(folder), "--json", "--depth", "4",
                 "--dtype", "fp32", "--no-progress", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def trained(plain, tmp_path_factory):
    """eyas's own capture of `plain`'s rows at CROSS, and a draft trained on it (over-fit, so its acceptance
    depends on every feature and the last state: a random draft's near-zero acceptance compares nothing)."""
    import cache_writers
    from eyas.train import TrainConfig, train

    folder, _, rows, _ = plain
    root = tmp_path_factory.mktemp("cross")
    cache_writers.write_eyas_shards(Target.load(folder), rows, root / "ours", CROSS)
    train(TrainConfig(data=str(root / "ours"), out=str(root / "run"), target=str(folder), draft_vocab=48,
                      ttt_steps=3, lr=1e-2, batch_tokens=64, epochs=200, max_steps=150, eval_fraction=0.0,
                      save_every=0, dtype="fp32", progress=False))
    return root / "ours", root / "run" / "draft"


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_a_foreign_cache_gives_the_acceptance_of_eyas_own_capture(plain, trained, tmp_path, capsys, fmt):
    import cache_writers

    folder, _, rows, _ = plain
    ours, draft = trained
    model = Target.load(folder).model
    out = tmp_path / fmt
    N = model.config.num_hidden_layers
    if fmt == "specforge":  # SpecForge ids are "output of layer k": capture index k + 1
        cache_writers.write_specforge(model, rows, out, layer_ids=[k - 1 for k in CROSS], batch_size=1)
    else:  # vLLM ids are capture indices, plus N (the pre-norm last state)
        cache_writers.write_speculators(model, rows, out, layer_ids=[*CROSS, N])
    mine, theirs = _eval(draft, ours, folder, capsys), _eval(draft, out, folder, capsys)  # fp32 both
    assert theirs["data"]["format"] == fmt and theirs["data"]["verdict"] == "target"
    assert mine["acceptance_by_depth"][0] > 0.3  # the comparison below is of a draft that predicts
    assert theirs["tokens"] == mine["tokens"]
    for key in ("acceptance_by_depth", "tau_chain", "tau_tree"):
        assert theirs[key] == pytest.approx(mine[key], nan_ok=True), key
    # speculators stores the last state before the final norm (read and applied); SpecForge after it (not read)
    assert ("model.norm.weight" in theirs["cost"]["target_tensors_read"]) == (fmt != "specforge")
    assert ("final norm and lm_head" in describe(theirs["data"]["verdict"], theirs["data"]["last_hidden"] == NORMED)) \
        == (fmt != "specforge")


def test_a_cache_without_the_last_state_is_judged_by_its_tokens_and_says_so(plain, tmp_path, capsys):
    import cache_writers

    folder, shards, rows, draft = plain
    dump = tmp_path / "dump.safetensors"
    from eyas.data import open_shards

    first = next(iter(open_shards(shards)))
    cache_writers.write_dump(dump, first["input_ids"], first["features"])
    rep = _eval(draft, dump, folder, capsys, "--data-format", "eyas-dump")
    assert rep["data"]["verdict"] == "stored tokens" and rep["tokens"] > 0
    assert "lm_head.weight" not in rep["cost"]["target_tensors_read"]


def _doctor_on_specforge(plain, tmp_path, capsys, draft_layers: str, cache_ids: list[int],
                         *flags: str) -> tuple[int, str, str, Path]:
    """The doctor (full target) on a SpecForge cache of the first 2 rows at SpecForge ids `cache_ids`
    (outputs of layers), for a fresh draft reading `draft_layers`: (exit code, stdout, stderr, cache)."""
    import cache_writers

    folder, _, rows, _ = plain
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", draft_layers]) == 0
    cache = tmp_path / "cache"
    cache_writers.write_specforge(Target.load(folder).model, rows[:2], cache, layer_ids=cache_ids)
    capsys.readouterr()
    code = main(["doctor", str(draft), "--features", str(cache), "--target", str(folder), "--no-progress", *flags])
    out, err = capsys.readouterr()
    return code, out, err, cache


def test_eval_says_in_one_warning_which_layers_a_specforge_cache_may_hold(plain, tmp_path, capsys):
    """SpecForge records no layers: eyas assumes its default, the draft reads its own, and SpecForge trained
    with the draft's config took that config's ids as outputs of layers. Three statements (a layers line and two
    warnings, one set each) are one warning naming the three sets."""
    import cache_writers

    folder, _, rows, _ = plain
    draft, cache = tmp_path / "draft", tmp_path / "cache"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", "1,2,3", "--format", "eagle"]) == 0
    cache_writers.write_specforge(Target.load(folder).model, rows[:2], cache, layer_ids=[0, 1, 2])
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(cache), "--target", str(folder), "--depth", "2",
                 "--no-progress"]) == 0
    (said,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    # SpecForge's default for this 4-layer target is ids [1, 1, 0] (capture [2, 2, 1]); the eagle config's nested ids
    # are [1, 2, 3], which SpecForge reads as outputs of layers
    assert said.endswith("reads capture [1, 2, 3], not the assumed [2, 2, 1]; SpecForge trained with config.json "
                         "captured [2, 3, 4] (its ids are outputs of layers); evaluating as if the cache held the "
                         "draft's layers"), said


def test_doctor_names_a_specforge_cache_taken_one_layer_too_deep(plain, tmp_path, capsys):
    # SpecForge ids [0, 1, 2] are outputs of layers 0..2 = capture [1, 2, 3]: one layer deeper than the draft reads
    code, out, _, _ = _doctor_on_specforge(plain, tmp_path, capsys, "0,1,2", [0, 1, 2], "--json")
    assert code == 1
    rep = json.loads(out)
    assert rep["findings"][0]["fault"] == "capture_layers"
    assert rep["cache"]["format"] == "specforge" and not rep["cache"]["layers_recorded"]
    assert [c["layer"] for c in rep["dump"]["chunks"]] == [1, 2, 3] == rep["cache"]["layers_found"]
    assert any("does not record its layers" in n for n in rep["notes"])
    assumed = rep["cache"]["capture_layers"]  # what the reader assumed (SpecForge's default), beside what it holds
    assert any(n.startswith(f"the cache's first sample holds capture [1, 2, 3], not the assumed {assumed}")
               for n in rep["notes"])
    assert any(n.startswith("2 samples of the cache measured: under 5") for n in rep["notes"])  # too few to confirm


def test_doctor_says_in_one_note_which_layers_a_specforge_cache_may_hold(plain, tmp_path, capsys):
    """The doctor's notes state the cache's layers once, SpecForge's reading of the draft's config beside the
    assumed ones, as eval's one warning does."""
    code, out, _, _ = _doctor_on_specforge(plain, tmp_path, capsys, "1,2,3", [0, 1, 2], "--json")
    said = [n for n in json.loads(out)["notes"] if "SpecForge trained with" in n]
    assert len(said) == 1 and said[0].startswith("feature cache (specforge): ") and said[0].endswith(
        "SpecForge trained with config_eagle.json captured [2, 3, 4] (its ids are outputs of layers)"), said


def test_the_doctor_refuses_a_capture_from_another_target_as_eval_does(plain, tmp_path, capsys):
    """doctor --features read an eyas capture against a target whose final norm was changed and said OK: eval and
    train refuse it by the norm's digest. Both read caches through one check now; a copy with the same norm is
    accepted by both, with the same warning."""
    folder, shards, _, draft = plain
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    ref = TargetRef.resolve(folder)
    tensors = ref.tensors(sorted(ref.tensor_names()))
    save_file({**tensors, "model.norm.weight": tensors["model.norm.weight"] * 1.01},
              other / "model.safetensors")
    for argv in (["eval", draft, "--data", shards], ["doctor", draft, "--features", shards]):
        capsys.readouterr()
        assert main([str(a) for a in argv] + ["--target", str(other), "--no-progress"]) == 2
        assert "its final norm's digest is" in capsys.readouterr().err
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    capsys.readouterr()
    assert main(["doctor", str(draft), "--features", str(shards), "--target", str(copy), "--no-progress",
                 "--json"]) in (0, 1)
    assert "final norm's digest matches" in " ".join(json.loads(capsys.readouterr().out)["stderr_warnings"])


def test_doctor_blames_a_cache_with_another_count_of_states_not_the_config(plain, tmp_path, capsys):
    """A cache of 3 states for a draft reading 2: the cache is taken again; the draft's config is right."""
    code, out, _, _ = _doctor_on_specforge(plain, tmp_path, capsys, "1,2", [0, 1, 2], "--json")
    assert code == 1
    (f,) = json.loads(out)["findings"]
    assert f["title"].startswith("the feature cache stores 3 states per position") and "engine" not in f["title"]
    assert f["fix"].startswith("capture the cache again at capture layers [1, 2]") and "set " not in f["fix"]


def test_doctor_refuses_a_cache_with_fewer_states_than_the_draft_reads_naming_it(plain, tmp_path, capsys):
    """fc cannot run on it: refused before measuring, naming the cache (fc's own error named neither)."""
    code, _, err, cache = _doctor_on_specforge(plain, tmp_path, capsys, "0,1,2,3", [0, 1, 2])
    assert code == 2
    assert err.startswith(f"error: {cache}: 3 captured layers per position") and "reads 4" in err, err


def test_doctor_names_no_wiring_an_untrained_draft_leans_to(plain, tmp_path):
    """Random weights measure better under some wiring (here the doctor once named a concatenation
    order a fault), but a draft that accepts almost nothing under every wiring is trained for none: no finding,
    and the verdict is inconclusive, not ok (it said ok, and "the weights fit")."""
    import random

    from eyas.doctor import diagnose
    from test_data import WORDS

    folder, _, _, draft = plain
    rnd = random.Random(0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(" ".join(rnd.choice(WORDS) for _ in range(5)) for _ in range(8)) + "\n")
    rep = diagnose(draft, target=folder, prompts=prompts, limit=8, max_new_tokens=32, progress=False)
    assert rep["verdict"] == "inconclusive" and rep["findings"] == []
    assert rep["inconclusive"].startswith("depth-1 acceptance is below 0.05 under every wiring")
    note = next(n for n in rep["notes"] if n.startswith("depth-1 acceptance is below 0.05 under every wiring"))
    assert "not named faults" in note and rep["trained_for"].startswith(f"capture layers {LAYERS}")
    assert rep["measured"]["trained_for"]["wiring"] == rep["measured"]["contract"]["wiring"]


def test_eval_dtype_auto_is_bf16_only_where_the_cpu_multiplies_it(monkeypatch):
    import eyas.evaluate as ev

    monkeypatch.setattr(ev, "bf16_dot_products", lambda: False)  # an AVX2-only CPU
    assert ev.eval_dtype("auto", None) == torch.float32 and ev.eval_dtype("auto", "cuda") == torch.bfloat16
    monkeypatch.setattr(ev, "bf16_dot_products", lambda: True)  # avx512_bf16 / AMX
    assert ev.eval_dtype("auto", "cpu") == torch.bfloat16
    assert ev.eval_dtype("fp32", None) == torch.float32


def test_bf16_dot_products_need_the_flags_and_torch_allowed_to_use_them(monkeypatch):
    from eyas import machine

    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(machine, "cpu_flags", lambda: ["avx2", "avx512f", "avx512_bf16"])
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert machine.bf16_dot_products()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # ATEN_CPU_CAPABILITY=avx2
    assert not machine.bf16_dot_products() and machine.cpu_class().startswith("AVX2 (emulated")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")  # ATEN_CPU_CAPABILITY=default
    assert not machine.bf16_dot_products() and machine.cpu_class().startswith("no vector set (emulated")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    for name in machine.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")  # oneDNN's bf16 products emulated; torch's dispatch is not capped
    key = machine.machine_key()
    assert not machine.bf16_dot_products() and machine.cpu_class().endswith(", oneDNN capped to AVX2")
    assert key[-1] == {"ONEDNN_MAX_CPU_ISA": "avx2"}  # timings made under the cap are cached apart
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert machine.machine_key() == key[:-1] and machine.bf16_dot_products()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(machine, "cpu_flags", lambda: ["avx2", "fma"])  # a real AVX2-only CPU
    assert not machine.bf16_dot_products() and machine.cpu_class() == "AVX2 only"


def _head_only(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """A target folder holding its config and only the named tensors (what a cache's verdict reads)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, folder / "model.safetensors")
    return folder


def test_a_head_of_other_shapes_than_the_config_says_is_refused(tmp_path):
    """A norm of the wrong width failed in the product (a traceback); an lm_head of fewer rows judged over
    fewer tokens, unsaid."""
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
              "hidden_size": 8, "vocab_size": 12, "num_attention_heads": 2, "tie_word_embeddings": False}
    good = {"model.norm.weight": torch.ones(8), "lm_head.weight": torch.randn(12, 8)}
    assert TargetRef.resolve(_head_only(tmp_path / "ok", config, good)).head().lm_head.shape == (12, 8)
    gemma = _head_only(tmp_path / "gemma", {**config, "text_config": {**config, "model_type": "gemma3_text"},
                                            "model_type": "gemma3"}, good)
    assert TargetRef.resolve(gemma).head().norm.offset == 1.0
    assert TargetRef.resolve(tmp_path / "ok").head().norm.offset == 0
    for name, bad, said in (("model.norm.weight", torch.ones(4), r"model.norm.weight is \[4\], config.json says \[8\]"),
                            ("lm_head.weight", torch.randn(10, 8), r"lm_head.weight is \[10, 8\], config.json says "
                                                                   r"\[12, 8\]")):
        folder = _head_only(tmp_path / name, config, {**good, name: bad})
        with pytest.raises(EyasError, match=said):
            TargetRef.resolve(folder).head()


def test_a_head_that_is_not_finite_is_refused_and_a_normed_cache_reads_no_norm(tmp_path):
    """A nan in the final norm or lm_head gave a verdict of argmax 0 everywhere: eval exited 0 with acceptance 0
    and blamed the stored answers. Refused naming the tensor; and a cache stored after the final norm is
    judged by lm_head alone, so its norm is neither read nor needed."""
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
              "hidden_size": 8, "vocab_size": 12, "num_attention_heads": 2, "tie_word_embeddings": False}
    good = {"model.norm.weight": torch.ones(8), "lm_head.weight": torch.randn(12, 8)}
    for name, value in (("model.norm.weight", float("nan")), ("lm_head.weight", float("inf"))):
        bad = good[name].clone()
        bad.view(-1)[3] = value
        folder = _head_only(tmp_path / name, config, {**good, name: bad})
        with pytest.raises(EyasError, match=f"{name} holds {int(value != value)} nan and {int(value == value)} inf"):
            TargetRef.resolve(folder).head()
    ref = TargetRef.resolve(tmp_path / "model.norm.weight")
    assert ref.head(normed=True).norm is None and ref.read == ["lm_head.weight"]


@pytest.mark.parametrize("family", ["gemma", "gemma2", "qwen3_next", "llama", "qwen3", "cohere", "cohere2"])
def test_the_final_norm_is_applied_as_the_targets_family_does(family):
    """Gemma's (and Qwen3-Next's) RMSNorm scales by 1 + weight: a speculators cache (stored before the norm) of a
    Gemma target was judged with Llama's norm, and its verdict disagreed with the target's own at 1 position in 5.
    Cohere's is a LayerNorm (the mean taken out first): judged as an RMSNorm, its argmax differed too."""
    import importlib
    import inspect

    from eyas.target_head import TargetNorm

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    [norm_class] = [c for n, c in vars(module).items() if n.endswith(("RMSNorm", "LayerNorm")) and inspect.isclass(c)]
    theirs = norm_class(16, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
    h = torch.randn(5, 16) * 3 + 1.5  # a mean to take out
    ours = TargetNorm.of(theirs.weight.detach().clone(), {family}, {"rms_norm_eps": 1e-6})(h)
    torch.testing.assert_close(ours, theirs(h).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rms_norm_eps", [None, 1e-6])
def test_cohere2_moes_final_norm_is_what_its_config_builds(rms_norm_eps):
    """Cohere2-MoE builds a LayerNorm for its final norm unless its config sets rms_norm_eps (then an RMSNorm):
    a pre-norm cache of it was judged as an RMSNorm either way."""
    import transformers

    from eyas.target_head import TargetNorm

    config = transformers.Cohere2MoeConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=rms_norm_eps)
    theirs = transformers.Cohere2MoeModel(config).norm
    with torch.no_grad():
        theirs.weight.normal_()
    h = torch.randn(5, 16) * 3 + 1.5
    ours = TargetNorm.of(theirs.weight.detach().clone(), {"cohere2_moe"}, config.to_dict())(h)
    torch.testing.assert_close(ours, theirs(h).float(), rtol=1e-5, atol=1e-5)


def test_the_doctor_applies_a_gemma_targets_norms_as_gemma_does(tmp_path):
    """Gemma's norms scale by 1 + weight (stored zero-centred): the doctor applied them as Llama's, so an engine
    dump of Gemma states through the final norm, or through a layer's input norm, matched no state."""
    import transformers

    from eyas.doctor import collect
    from eyas.doctor.dumps import match_dump
    from eyas.doctor.measure import Measurer
    from eyas.formats import read_checkpoint

    folder = save_tiny_target(tmp_path / "gemma")
    config = transformers.Gemma2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, eos_token_id=1,
                                       pad_token_id=0, bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.5)  # zero-centred weights, as trained ones are
    model.save_pretrained(folder)
    assert main(["init", str(tmp_path / "draft"), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    (tmp_path / "p.txt").write_text("hello there\n")
    cap = collect(Target.load(folder), tmp_path / "p.txt", limit=1, max_new_tokens=8, progress=False)
    sample, decoder = cap.samples[0], cap.target.decoder
    with torch.no_grad():
        chunks = [sample["states"][:, 1], decoder.norm(sample["states"][:, 2]),
                  decoder.layers[3].input_layernorm(sample["states"][:, 3])]
    found = match_dump(torch.cat(chunks, -1), sample, Measurer(read_checkpoint(tmp_path / "draft"), cap))
    assert [(c["layer"], c["state"], c["shift"]) for c in found] == [(1, "raw", 0), (2, "final_norm", 0),
                                                                       (3, "input_norm", 0)]


def test_the_doctor_runs_a_target_whose_layers_have_no_input_norm(tmp_path):
    """OLMo 2 normalises after attention and MLP, not before: the doctor read every layer's input_layernorm and
    stopped with an AttributeError's traceback."""
    import transformers

    folder = save_tiny_target(tmp_path / "olmo2")
    config = transformers.Olmo2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=1, pad_token_id=0,
                                      bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.Olmo2ForCausalLM(config).save_pretrained(folder)
    assert main(["init", str(tmp_path / "draft"), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    (tmp_path / "p.txt").write_text("hello there\nthe cat sat\n")
    assert main(["doctor", str(tmp_path / "draft"), "--target", str(folder), "--prompts", str(tmp_path / "p.txt"),
                 "--limit", "2", "--max-new-tokens", "8", "--no-progress"]) in (0, 1)  # a verdict, either way


@pytest.mark.parametrize("family", ["starcoder2", "stablelm", "phimoe", "nemotron", "jais2"])
def test_a_layer_norm_head_read_alone_gives_the_targets_logits(family, tmp_path):
    """Their final norm is a LayerNorm with a bias (Nemotron's scales by 1 + weight too): a cache stored before it
    (speculators) was judged as Llama's RMSNorm, the bias unread, its logits off by 3 to 8 on tiny models."""
    import transformers

    config = transformers.AutoConfig.for_model(family, vocab_size=48, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()  # Phi-3.5-MoE's router jitters in training
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # a bias and weights far from 0 and 1
    model.save_pretrained(tmp_path / family)
    head = TargetRef.resolve(tmp_path / family).head()
    assert head.norm.bias is not None and head.norm.centered
    target = Target.load(tmp_path / family)
    ids = torch.randint(3, 40, (1, 6))
    before_norm = target.forward(ids, (target.num_layers,)).features[0]  # what a speculators cache stores
    torch.testing.assert_close(head.normalize(before_norm) @ head.lm_head.float().T, model(input_ids=ids).logits[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["olmo", "nanochat"])
def test_a_weightless_final_norm_read_alone_gives_the_targets_logits(family, tmp_path):
    """OLMo's LayerNorm and nanochat's RMSNorm have no weight: a cache's verdict was refused with "tensor
    'model.norm.weight' not found", which misleads (there is none to find); OLMo's eps is its class's 1e-5."""
    import transformers

    config = transformers.AutoConfig.for_model(family, vocab_size=48, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / family)
    assert not any(name.startswith("model.norm") for name in TargetRef.resolve(tmp_path / family).tensor_names())
    head = TargetRef.resolve(tmp_path / family).head()
    assert head.norm.centered == (family == "olmo") and head.norm.eps == (1e-5 if family == "olmo" else 1e-6)
    target = Target.load(tmp_path / family)
    ids = torch.randint(3, 40, (1, 6))
    before_norm = target.forward(ids, (target.num_layers,)).features[0]  # what a speculators cache stores
    ours = head.logit_map(head.normalize(before_norm) @ head.lm_head.float().T)  # nanochat's softcap
    torch.testing.assert_close(ours, model(input_ids=ids).logits[0], rtol=1e-4, atol=1e-4)


def test_a_head_that_adds_a_bias_is_refused_where_eyas_would_leave_it_out(tmp_path):
    """Phi-3.5-MoE's lm_head adds a bias (lm_head_bias): verdicts from lm_head.weight alone would leave it out."""
    import transformers

    config = transformers.PhimoeConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, lm_head_bias=True)
    transformers.PhimoeForCausalLM(config).save_pretrained(tmp_path / "phimoe")
    with pytest.raises(EyasError, match=r"the target's lm_head adds a bias \(lm_head.bias"):
        TargetRef.resolve(tmp_path / "phimoe").head()
    with pytest.raises(EyasError, match="the target's lm_head adds a bias"):
        predict(None, Target.load(tmp_path / "phimoe"), [1], [[3]], [[4]], 1)


def test_sampled_acceptance_reads_the_logits_as_the_targets_class_does(sharded, tmp_path, capsys):
    """final_logit_softcapping in a Llama config: --temperature was refused, though Llama's class never reads it;
    the figures equal the plain config's (eyas.logit_map: the class decides; tests/test_logit_map.py maps them)."""
    folder, shards, draft = sharded
    capped = tmp_path / "capped"
    shutil.copytree(folder, capped)
    config = json.loads((capped / "config.json").read_text())
    (capped / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 30.0}))
    figures = []
    for target in (folder, capped):
        capsys.readouterr()
        assert main(["eval", str(draft), "--data", str(shards), "--target", str(target), "--dtype", "fp32",
                     "--no-progress", "--temperature", "0.7", "--json"]) == 0
        figures.append(json.loads(capsys.readouterr().out)["sampled"])
    assert figures[0] == figures[1]
