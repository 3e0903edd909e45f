"""eyas.data.caches: other trainers' feature caches, written from a tiny random Llama target exactly as
those trainers write them (tests/cache_writers.py), read back and compared with eyas's own capture of
the same sequences; detection, layer notes, and the one-line refusals."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from cache_writers import (
    write_dump,
    write_eyas_shards,
    write_modelopt,
    write_specforge,
    write_speculators,
    write_speculators_legacy,
)
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from eyas.data.caches import CACHE_FORMATS, NORMED, PRE_NORM, detect_format, open_cache
from eyas.errors import FormatError
from eyas.target import Target

pytestmark = pytest.mark.usefixtures("one_thread")

N, H = 8, 32  # 8 layers, so every trainer's default picks three distinct layers: capture [2, 4, 5]
DEFAULT_CAPTURE = (2, 4, 5)
LENGTHS = (7, 11, 5, 9)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Target:
    folder = tmp_path_factory.mktemp("tiny-target")
    config = LlamaConfig(vocab_size=64, hidden_size=H, intermediate_size=64, num_hidden_layers=N,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return Target.load(folder)


@pytest.fixture(scope="module")
def rows() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sequences with no id 0 (SpecForge's pad id), a prompt part out of the loss and an answer in it."""
    g = torch.Generator().manual_seed(3)
    out = []
    for T in LENGTHS:
        ids = torch.randint(1, 64, (T,), generator=g)
        mask = torch.zeros(T, dtype=torch.long)
        mask[T // 2:] = 1
        out.append((ids, mask))
    return out


def eyas_capture(target: Target, ids: torch.Tensor, layers) -> dict[str, torch.Tensor]:
    """eyas's own capture: features at `layers`, the normed last hidden, and index N (before the norm)."""
    o = target.forward(ids[None], (*layers, target.num_layers), with_logits=False)
    W = len(layers) * target.hidden_size
    return {"features": o.features[0, :, :W], "pre_norm": o.features[0, :, W:], "last_hidden": o.last_hidden[0]}


def check_samples(cache, target, rows, *, layers=DEFAULT_CAPTURE, last=NORMED, order=None):
    """Every sample read back equals eyas's capture of the same (unpadded) sequence."""
    samples = list(cache)
    assert len(samples) == len(cache) == len(order or rows)
    for sample, i in zip(samples, order or range(len(rows))):
        ids, mask = rows[i]
        assert torch.equal(sample["input_ids"], ids) and sample["input_ids"].dtype == torch.int64
        assert torch.equal(sample["loss_mask"], mask.bool())
        ref = eyas_capture(target, ids, layers)
        torch.testing.assert_close(sample["features"], ref["features"], rtol=1e-5, atol=1e-5)
        if last is None:
            assert "last_hidden" not in sample
        else:
            torch.testing.assert_close(sample["last_hidden"], ref["last_hidden" if last == NORMED else "pre_norm"],
                                       rtol=1e-5, atol=1e-5)
    return samples


def one_line(e: pytest.ExceptionInfo, *words: str) -> str:
    text = str(e.value)
    assert "\n" not in text and "\n" not in (e.value.hint or "")
    for w in words:
        assert w in text, (w, text)
    return text


# --- SpecForge ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_specforge_cache_reads_as_eyas_captures(target, rows, tmp_path, compress):
    files = write_specforge(target.model, rows, tmp_path / "sf", batch_size=2, group_size=2, compress=compress)
    assert [f.parent.name for f in files] == ["rows_0-2", "rows_0-2", "rows_2-4", "rows_2-4"]
    if not compress:  # the first batch is padded to its longest row (11): pads are stored, with loss 0
        raw = torch.load(files[0], weights_only=True)
        assert raw["aux_hidden_state"].shape == (1, 11, 3 * H) and raw["hidden_state"].shape == (1, 11, H)
        assert raw["input_ids"].shape == (11,) and not raw["loss_mask"][LENGTHS[0]:].any()
    assert detect_format(tmp_path / "sf") == "specforge"
    cache = open_cache(tmp_path / "sf", num_layers=N)
    info = cache.info
    assert (info.format, info.hidden_size, info.num_slots, info.num_samples) == ("specforge", H, 3, 4)
    assert info.capture_layers == DEFAULT_CAPTURE and not info.layers_recorded and info.last_hidden == NORMED
    assert info.layers_note.startswith("stored: output of layers 1, 3, 4 = capture [2, 4, 5] (assumed: SpecForge's "
                                       "default for a 8-layer target")
    assert "does not record" in info.layers_note and "unknown" in info.answers_note
    check_samples(cache, target, rows)  # right padding stripped: lengths are the rows' own


def test_specforge_layers_given_unknown_and_string_order(target, rows, tmp_path):
    many = [rows[i % len(rows)] for i in range(11)]  # data_10 sorts before data_2, as SpecForge lists them
    write_specforge(target.model, many, tmp_path / "sf", layer_ids=[2, 3, 5], batch_size=1)
    cache = open_cache(tmp_path / "sf", layer_ids=(3, 4, 6))
    assert cache.info.capture_layers == (3, 4, 6)
    assert cache.info.layers_note.startswith("stored: output of layers 2, 3, 5 = capture [3, 4, 6] (as given")
    order = sorted(range(11), key=str)
    check_samples(cache, target, many, layers=(3, 4, 6), order=order)
    unknown = open_cache(tmp_path / "sf")
    assert unknown.info.capture_layers is None and unknown.info.layers_note.startswith("unknown: SpecForge")
    with pytest.raises(FormatError) as e:
        open_cache(tmp_path / "sf", layer_ids=(1, 2))
    one_line(e, "2 layers", "3 per position")


def test_specforge_old_serialization_and_single_file(target, rows, tmp_path):
    (path,) = write_specforge(target.model, rows[:1], tmp_path / "sf", batch_size=1)
    record = torch.load(path, weights_only=True)
    torch.save(record, path, _use_new_zipfile_serialization=False)  # cannot be memory-mapped: read plainly
    assert detect_format(path) == "specforge"
    check_samples(open_cache(path, num_layers=N), target, rows[:1])


# --- speculators -------------------------------------------------------------------------------


def test_speculators_cache_reads_as_eyas_captures(target, rows, tmp_path):
    pytest.importorskip("datasets")
    write_speculators(target.model, rows, tmp_path / "spec")
    assert detect_format(tmp_path / "spec") == "speculators"
    cache = open_cache(tmp_path / "spec", num_layers=N)
    info = cache.info
    assert (info.hidden_size, info.num_slots, info.num_samples, info.last_hidden) == (H, 3, 4, PRE_NORM)
    assert info.capture_layers == DEFAULT_CAPTURE and not info.layers_recorded
    assert info.layers_note.startswith("stored: input of layers 2, 4, 5 = capture [2, 4, 5] (assumed: speculators'")
    samples = check_samples(cache, target, rows, last=PRE_NORM)
    norm = target.model.model.norm  # a pre-norm last hidden becomes eyas's last_hidden through the final norm
    torch.testing.assert_close(norm(samples[0]["last_hidden"]), eyas_capture(target, rows[0][0], ())["last_hidden"])
    full = open_cache(tmp_path / "spec", layer_ids=(2, 4, 5, 8))  # vLLM's whole id list: the last id is the last hidden
    assert full.info.capture_layers == DEFAULT_CAPTURE and "(as given" in full.info.layers_note
    with pytest.raises(FormatError) as e:  # one row's file alone: its cache is named, not a layer count
        detect_format(tmp_path / "spec" / "hidden_states" / "hs_0.safetensors")
    assert f"point at the cache folder: {tmp_path / 'spec'}" == e.value.hint
    one_line(e, "hs_0.safetensors", "one row of the speculators cache")


def test_speculators_missing_rows_are_skipped_and_wrong_tokens_refused(target, rows, tmp_path):
    pytest.importorskip("datasets")
    write_speculators(target.model, rows, tmp_path / "spec", skip=(1,))
    with pytest.warns(UserWarning, match="1 of 4 rows have no hidden states"):
        cache = open_cache(tmp_path / "spec", num_layers=N)
    assert len(cache) == 3
    check_samples(cache, target, rows, last=PRE_NORM, order=[0, 2, 3])
    hs_file = tmp_path / "spec" / "hidden_states" / "hs_2.safetensors"
    t = load_file(hs_file)
    t["token_ids"] = t["token_ids"].flip(0)
    save_file(t, str(hs_file))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cache = open_cache(tmp_path / "spec", num_layers=N)
    with pytest.raises(FormatError) as e:
        list(cache)
    one_line(e, str(hs_file), "token_ids", "row 2")


def test_speculators_legacy_is_read_with_its_recorded_layers(target, rows, tmp_path):
    write_speculators_legacy(target.model, rows, tmp_path / "legacy")
    assert detect_format(tmp_path / "legacy") == "speculators-legacy"
    cache = open_cache(tmp_path / "legacy", num_layers=N)
    info = cache.info
    assert info.capture_layers == (3, 5, 6) and info.layers_recorded and info.last_hidden == PRE_NORM
    assert info.layers_note.startswith("stored: output of layers 2, 4, 5 = capture [3, 5, 6] (recorded in "
                                       "data_config.json)")
    assert "one layer deeper" in info.layers_note
    check_samples(cache, target, rows, layers=(3, 5, 6), last=PRE_NORM)
    write_speculators_legacy(target.model, rows[:1], tmp_path / "bare", with_config=False)
    assert detect_format(tmp_path / "bare") == "speculators-legacy"  # from the keys of its data_0.pt
    assert open_cache(tmp_path / "bare", num_layers=N).info.capture_layers == (3, 5, 6)


def test_speculators_legacy_without_the_final_layer_reads_every_stored_layer_as_a_feature(target, rows, tmp_path):
    """Ids [1, 3, 4] (output convention, no N-1 appended): three feature layers, capture [2, 4, 5], no last state;
    without the target's depth the last stored state is read as speculators' reader reads it."""
    write_speculators_legacy(target.model, rows, tmp_path / "legacy", layer_ids=[1, 3, 4])
    cache = open_cache(tmp_path / "legacy", num_layers=N)
    assert cache.info.num_slots == 3 and cache.info.capture_layers == (2, 4, 5) and cache.info.last_hidden is None
    assert "every stored layer is a feature layer" in cache.info.layers_note
    check_samples(cache, target, rows, layers=(2, 4, 5), last=None)
    blind = open_cache(tmp_path / "legacy").info
    assert blind.num_slots == 2 and blind.capture_layers == (2, 4) and blind.last_hidden == PRE_NORM


# --- ModelOpt ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prenorm", [False, True])
def test_modelopt_cache_reads_as_eyas_captures(target, rows, tmp_path, prenorm):
    write_modelopt(target.model, rows, tmp_path / "mo", prenorm=prenorm)
    assert detect_format(tmp_path / "mo") == "modelopt"
    cache = open_cache(tmp_path / "mo", num_layers=N)
    assert cache.info.capture_layers == DEFAULT_CAPTURE and cache.info.num_slots == 3
    assert cache.info.layers_note.startswith("stored: output of layers 1, 3, 4 = capture [2, 4, 5] (assumed: ModelOpt")
    check_samples(cache, target, rows, last=PRE_NORM if prenorm else NORMED)


# --- eyas's own shards and dumps -----------------------------------------------------------------


def test_eyas_shards_and_dumps_behind_the_same_interface(target, rows, tmp_path):
    write_eyas_shards(target, rows, tmp_path / "shards", layers=[1, 3, 6])
    assert detect_format(tmp_path / "shards") == "eyas"
    cache = open_cache(tmp_path / "shards", num_layers=N)
    info = cache.info
    assert info.capture_layers == (1, 3, 6) and info.layers_recorded and info.last_hidden == NORMED
    assert "recorded in manifest.json" in info.layers_note and "greedy" in info.answers_note
    check_samples(cache, target, rows, layers=(1, 3, 6))

    ids = rows[1][0]
    write_dump(tmp_path / "dump.safetensors", ids, eyas_capture(target, ids, DEFAULT_CAPTURE)["features"])
    assert detect_format(tmp_path / "dump.safetensors") == "eyas-dump"
    dump = open_cache(tmp_path / "dump.safetensors", num_layers=N)
    assert dump.info.capture_layers is None and dump.info.last_hidden is None and dump.info.hidden_size == H
    (sample,) = list(dump)
    assert torch.equal(sample["input_ids"], ids) and bool(sample["loss_mask"].all())
    assert open_cache(tmp_path / "dump.safetensors", layer_ids=DEFAULT_CAPTURE).info.capture_layers == DEFAULT_CAPTURE


# --- refusals ----------------------------------------------------------------------------------


class NotATensor:
    """A class a pickle would have to import: weights_only refuses it."""


def spoiled_specforge(target, rows, folder, change) -> list:
    """A SpecForge cache of `rows` (one per batch) whose last file's record went through `change`."""
    files = write_specforge(target.model, rows, folder, batch_size=1)
    record = torch.load(files[-1], weights_only=True)
    torch.save(change(record), files[-1])
    return files


def test_unknown_folders_are_named_with_the_formats(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError) as e:
        detect_format(tmp_path / "empty")
    one_line(e, str(tmp_path / "empty"), "an empty folder")
    assert "--data-format" in e.value.hint and all(f in e.value.hint for f in CACHE_FORMATS)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hi")
    with pytest.raises(FormatError) as e:
        open_cache(tmp_path / "other")
    one_line(e, "no feature cache found", "notes.txt")
    with pytest.raises(FormatError) as e:
        open_cache(tmp_path / "other", format="nonsense")
    one_line(e, "'nonsense'")


def test_a_pickle_needing_more_than_weights_is_refused(target, rows, tmp_path):
    (path,) = spoiled_specforge(target, rows[:1], tmp_path / "sf", lambda r: {**r, "extra": NotATensor()})
    with pytest.raises(FormatError) as e:
        open_cache(tmp_path / "sf", num_layers=N)
    one_line(e, str(path), "weights_only", "NotATensor")


def test_wrong_width_and_wrong_format_are_refused(target, rows, tmp_path):
    files = spoiled_specforge(target, rows[:2], tmp_path / "sf",
                              lambda r: {**r, "aux_hidden_state": r["aux_hidden_state"][..., :-1]})
    cache = open_cache(tmp_path / "sf", num_layers=N)
    with pytest.raises(FormatError) as e:
        list(cache)
    one_line(e, str(files[1]), "aux_hidden_state", f"[{LENGTHS[1]}, {3 * H}]")
    with pytest.raises(FormatError) as e:
        open_cache(tmp_path / "sf", format="speculators")
    one_line(e, "state.json")


def test_specforge_ids_must_be_integers(target, rows, tmp_path):
    (path,) = spoiled_specforge(target, rows[:1], tmp_path / "sf", lambda r: {**r, "input_ids": r["input_ids"].float()})
    with pytest.raises(FormatError) as e:
        list(open_cache(tmp_path / "sf", num_layers=N))
    one_line(e, str(path), "input_ids", "integer token ids")
    json.dumps(open_cache(tmp_path / "sf").info.layers_note)  # notes are plain text for reports


@pytest.mark.parametrize(("change", "words"), [
    (lambda r: {**r, "loss_mask": r["loss_mask"].to_sparse()}, ("loss_mask", "expected an integer or bool mask")),
    (lambda r: {**r, "hidden_state": r["hidden_state"].to("meta")}, ("hidden_state", "expected float")),
    (lambda r: {**r, "loss_mask": r["loss_mask"].long() * 101 - 100}, ("loss_mask holds -100", "0 and 1 only")),
    (lambda r: {1: r["input_ids"], **{k: v for k, v in r.items() if k != "hidden_state"}}, ("no 'hidden_state'",)),
    # the ids cut short: the first tensor checked against their length (loss_mask) was blamed
    (lambda r: {**r, "input_ids": r["input_ids"][:-2]}, ("input_ids holds", "loss_mask and aux_hidden_state and "
                                                         "hidden_state hold")),
])
def test_samples_no_trainer_writes_are_one_line(target, rows, tmp_path, change, words):
    """A sparse or meta tensor, a -100 "mask", a key that is no text: tracebacks inside torch or sorted(),
    or (the -100 mask) read as every position trained on; refused naming the file."""
    (path,) = spoiled_specforge(target, rows[:1], tmp_path / "sf", change)
    with pytest.raises(FormatError) as e:
        list(open_cache(tmp_path / "sf", num_layers=N))
    one_line(e, str(path), *words)


def test_fp8_states_are_read_as_bf16_and_ids_past_the_vocab_name_their_file(target, rows, tmp_path):
    """fp8 states (exact in bf16) were a NotImplementedError from isfinite; ids past the target's vocab were
    named by the cache's folder and the sample's place in the read order, not its file."""
    def fp8(r):
        return {**r, **{k: r[k].to(torch.float8_e4m3fn) for k in ("aux_hidden_state", "hidden_state")}}
    (path,) = spoiled_specforge(target, rows[:1], tmp_path / "fp8", fp8)
    (sample,) = list(open_cache(tmp_path / "fp8", num_layers=N))
    stored = torch.load(path, weights_only=True)["aux_hidden_state"]
    assert sample["features"].dtype == torch.bfloat16 and torch.equal(sample["features"], stored[0].to(torch.bfloat16))
    files = spoiled_specforge(target, rows[:2], tmp_path / "ids", lambda r: {**r, "input_ids": r["input_ids"] + 64})
    with pytest.raises(FormatError) as e:
        list(open_cache(tmp_path / "ids", num_layers=N, vocab_size=64))
    one_line(e, str(files[-1]), "input_ids")


def test_a_folder_named_like_a_specforge_sample_is_not_skipped_silently(tmp_path):
    """os.walk lists it among folders: SpecForge's own glob would take it, and reading it must fail
    naming it rather than the cache quietly holding one sample fewer."""
    from eyas.data.caches.pickles import load_record
    from eyas.data.caches.specforge import list_files

    rows = tmp_path / "rows_0-2000"
    (rows / "data_0.ckpt").mkdir(parents=True)
    assert list_files(tmp_path) == [rows / "data_0.ckpt"]
    with pytest.raises(FormatError, match=r"data_0.ckpt: not a readable torch.save file \(IsADirectoryError"):
        load_record(rows / "data_0.ckpt", "specforge")


# --- caches told apart from other files, and from each other -------------------------------------


def test_outputs_stay_out_of_modelopt_and_legacy_speculators_caches(target, rows, tmp_path):
    """Their readers list every *.pt (ModelOpt, recursively) or data_{i}.pt: a checkpoint or a plot
    written inside one becomes a sample. A folder that merely holds some *.pt is no cache."""
    from eyas.cli import preflight
    from eyas.data.caches.detect import marked_cache
    from eyas.errors import EyasError

    write_modelopt(target.model, rows[:2], tmp_path / "mo")
    write_speculators_legacy(target.model, rows[:2], tmp_path / "legacy")
    write_speculators_legacy(target.model, rows[:2], tmp_path / "bare", with_config=False)
    for name, fmt in (("mo", "modelopt"), ("legacy", "speculators-legacy"), ("bare", "speculators-legacy")):
        cache = tmp_path / name
        before = sorted(cache.rglob("*"))
        assert marked_cache(cache) == fmt
        with pytest.raises(EyasError, match=rf"\(--out\) is inside the {fmt} feature cache {cache}:") as e:
            preflight.apart(cache / "run" / "checkpoints", "--out", {})
        one_line(e, "outputs stay out of feature caches")
        with pytest.raises(EyasError, match=rf"\(--plot\) is inside the {fmt} feature cache"):
            preflight.apart(cache / "data_6.pt", "--plot", {})
        assert sorted(cache.rglob("*")) == before
    other = tmp_path / "project"
    other.mkdir()
    torch.save({"step": 1, "model": {"w": torch.zeros(2)}}, other / "a_checkpoint.pt")
    (other / "data_0.pt").write_bytes(b"not a torch file")
    assert marked_cache(other) is None
    preflight.apart(other / "run", "--out", {})


@pytest.mark.parametrize("second", ["modelopt", "eyas", "speculators", "speculators-legacy"])
def test_a_folder_holding_two_caches_is_refused_unless_one_is_named(target, rows, tmp_path, second):
    """Each reader takes only its own files: a folder read as one format would skip the other's
    samples unsaid. --data-format (open_cache's `format`) picks the one to read."""
    mixed = tmp_path / "mixed"
    write_specforge(target.model, rows[:1], mixed, batch_size=1)
    {"modelopt": lambda: write_modelopt(target.model, rows[1:3], mixed),
     "eyas": lambda: write_eyas_shards(target, rows[1:3], mixed, layers=list(DEFAULT_CAPTURE)),
     "speculators": lambda: write_speculators(target.model, rows[1:3], mixed),
     "speculators-legacy": lambda: write_speculators_legacy(target.model, rows[1:3], mixed)}[second]()
    with pytest.raises(FormatError) as e:
        detect_format(mixed)
    one_line(e, str(mixed), "2 feature caches", "specforge", second)
    assert "--data-format specforge" in e.value.hint and f"--data-format {second}" in e.value.hint
    assert len(open_cache(mixed, format="specforge", num_layers=N)) == 1
    assert len(open_cache(mixed, format=second, num_layers=N)) == 2


def test_a_speculators_dataset_with_a_bool_loss_mask_reads_as_the_ckpt_caches_do(target, rows, tmp_path):
    """The Arrow reader refused a list<bool> loss_mask column that every torch.save reader takes."""
    bools = [(ids, mask.bool()) for ids, mask in rows]
    write_speculators(target.model, bools, tmp_path / "spec")
    samples = list(open_cache(tmp_path / "spec", num_layers=N))
    assert [s["loss_mask"].tolist() for s in samples] == [mask.tolist() for _, mask in bools]


def test_a_folder_of_caches_is_not_read_as_one(target, rows, tmp_path):
    """An eyas capture and a SpecForge cache side by side below one folder: the walk read SpecForge's
    samples and skipped the capture unsaid. One cache below a folder still reads (a parent of one output)."""
    write_specforge(target.model, rows[:2], tmp_path / "one" / "sf", batch_size=1)
    assert detect_format(tmp_path / "one") == "specforge"
    write_specforge(target.model, rows[:2], tmp_path / "two" / "sf", batch_size=1)
    write_eyas_shards(target, rows[2:], tmp_path / "two" / "capture", layers=list(DEFAULT_CAPTURE))
    with pytest.raises(FormatError) as e:
        open_cache(tmp_path / "two", num_layers=N)
    one_line(e, str(tmp_path / "two"), "holds 2 feature caches in its folders (capture, sf)")
