"""SpecForge's offline hidden-state cache: one `torch.save` dict per sample, `data_{idx}.ckpt[.gz]`.

Read from sgl-project/SpecForge @ a6b6b0230009d15ec2a97a57384e6f53f0f96946 (main, 2026-08-08):
- writer `scripts/prepare_hidden_states.py` (`HiddenStatesGenerator._get_file_path`: files
  `rows_{g}-{g+G}/data_{idx}.ckpt`, `.ckpt.gz` with `--compress`; `generate`: `aux_hidden_state` and
  `hidden_state` get a leading batch dim via `.unsqueeze(0)`, `input_ids` / `loss_mask` are the
  dataloader's 1-D rows), with the key names from `OfflineCaptureLayout` in
  `specforge/algorithms/eagle3/providers.py`;
- capture `specforge/offline_capture/sglang_backend/capture.py::capture_eagle3`: each batch row,
  right-padded with id 0 / loss 0 by `DataCollatorWithPadding` (`specforge/data/utils.py`), is sent
  whole as the prompt (`origin_input_ids=input_row.view(-1).tolist()`), so pads are stored too;
  `sglang_backend/utils.py`: `last_hidden_states=pruned_states`, the state after the final norm
  (SpecForge's `TargetHead` is a bare `lm_head`, `specforge/modeling/target/target_head.py`);
- layers `specforge/algorithms/model_providers.py::resolve_eagle_capture_layers`: the run's
  `aux_hidden_state_layer_ids`, else the draft config's `eagle_config.eagle_aux_hidden_state_layer_ids`,
  else `[1, N//2-1, N-4]`, each the OUTPUT of that layer (SGLang captures `layers_to_capture =
  [val + 1 ...]`, sglang `models/llama.py::set_eagle3_layers_to_capture`). Nothing on disk records them.
- reader `specforge/runtime/data_plane/offline_reader.py::list_feature_files` (recursive walk, every
  `*.ckpt` / `*.ckpt.gz`, paths sorted as strings), `feature_store.py::load_feature_file`,
  `specforge/algorithms/eagle3/data.py::normalize_offline_sample` (`.squeeze(0)`).
The pre-refactor writer (@20e2e3f0563f65746566e6da6202cdd3b77e16bc, `DataPoint` saved with
`torch.save(asdict(dp))`, SGLang backend; its HF backend only for Qwen2.5-VL) writes the same keys.

SpecForge itself loads with `weights_only=False`; eyas uses `weights_only=True` (the files are plain
dicts of tensors, as SpecForge's own test `tests/test_scripts/test_prepare_hidden_states.py` loads them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from eyas.data.caches.base import NORMED, UNKNOWN_ANSWERS, CacheInfo, as_ids, make_sample, need, \
    slots_of, strip_right_padding
from eyas.data.caches.layers import Convention, resolve_layers, to_capture
from eyas.data.caches.pickles import FileCache, load_record

FORMAT = "specforge"
SUFFIXES = (".ckpt", ".ckpt.gz")
KEYS = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")
CONVENTION = Convention(
    trainer="SpecForge",
    output_of_layer=True,
    default=lambda n: (1, n // 2 - 1, n - 4),
    default_text="[1, N//2-1, N-4]",
    chosen_by="it takes them from the draft config's eagle_config.eagle_aux_hidden_state_layer_ids, "
              "else this default",
)


def list_files(folder: Path) -> list[Path]:
    """Every `*.ckpt` / `*.ckpt.gz` below `folder`, sorted as strings (SpecForge's order, not numeric)."""
    if folder.is_file():
        return [folder]
    found = [os.path.join(root, name) for root, dirs, names in os.walk(folder) for name in (*names, *dirs)
             if name.endswith(SUFFIXES)]  # a folder so named is listed too: reading it fails naming it
    return [Path(p) for p in sorted(found)]


def layers_for_draft(folder: Path) -> tuple[str, tuple[int, ...]] | None:
    """The capture layers SpecForge takes when trained with a config from the draft folder `folder`
    (`--draft-model-config`): a flat config's nested `eagle_config.eagle_aux_hidden_state_layer_ids`,
    each the OUTPUT of that layer (capture = id + 1). Returns (file name, capture), or None when no
    config there names them (SpecForge then used its default)."""
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        try:
            ids = json.loads(path.read_text(encoding="utf-8"))["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        if isinstance(ids, list) and ids and all(isinstance(k, int) and not isinstance(k, bool) for k in ids):
            return path.name, to_capture(CONVENTION, ids)
    return None


def trained_reading(folder: Path, info: CacheInfo, layers: tuple[int, ...]) -> str:
    """Where the cache is SpecForge's and the draft folder names other layers than its reader assumed, the
    layers a cache made with that config holds, as a clause for the one warning or note that states the
    cache's layers (the seed's fault: ids written as capture indices, which SpecForge and SGLang read as
    outputs of layers); "" otherwise."""
    assumed = info.capture_layers
    named = layers_for_draft(folder) if info.format == FORMAT else None
    if named is None or assumed is None or named[1] == tuple(assumed):
        return ""
    same = ", the draft's own" if named[1] == layers else ""
    return f"; SpecForge trained with {named[0]} captured {list(named[1])}{same} (its ids are outputs of layers)"


def has_files(folder: Path) -> bool:
    """True at the first `*.ckpt[.gz]` found (a cache can hold millions: never list it all to detect it)."""
    return any(name.endswith(SUFFIXES) for _root, _dirs, names in os.walk(folder) for name in names)


class SpecForgeCache(FileCache):
    """A SpecForge cache folder (or one `.ckpt` file); samples stream one file at a time."""

    def __init__(self, path: Path, *, num_layers: int | None = None, layer_ids: Sequence[int] | None = None):
        first = self.first_record(path, list_files(path), FORMAT, "point at the --output-path of SpecForge's "
                                  "scripts/prepare_hidden_states.py (it holds data_<idx>.ckpt files)")
        H, slots = slots_of(first, "aux_hidden_state", "hidden_state", self.files[0], FORMAT)
        layers = resolve_layers(CONVENTION, slots, path, num_layers=num_layers, layer_ids=layer_ids)
        mapping = path / "vocab_mapping" / "vocab_mapping.pt"
        self.vocab_mapping = mapping if mapping.is_file() else None  # SpecForge's d2t / t2d, when written
        self.info = CacheInfo(FORMAT, path, H, slots, layers.capture, layers.recorded, layers.note, NORMED,
                              UNKNOWN_ANSWERS, len(self.files))

    def read_sample(self, path: Path) -> dict[str, Tensor]:
        """One `data_{idx}.ckpt`: checked, batch dim dropped, right padding stripped."""
        record = load_record(path, FORMAT)
        ids = as_ids(need(record, "input_ids", path, FORMAT), "input_ids", path, FORMAT)
        sample = make_sample(self.info, path, ids, need(record, "loss_mask", path, FORMAT),
                             need(record, "aux_hidden_state", path, FORMAT),
                             need(record, "hidden_state", path, FORMAT), KEYS)
        return strip_right_padding(sample)

