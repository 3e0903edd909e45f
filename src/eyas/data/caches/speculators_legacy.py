"""speculators' legacy data-generation output (2025-11 to 2026-03): `data_{i}.pt` per sample.

Read from vllm-project/speculators @ 21180f6a289442b4a0dcfc590f88cf94d7c6cd24 (2026-02-23), the last
era of this format (replaced by the Arrow + safetensors layout in 2a1443c, its training reader
removed in c80a242):
- writer `scripts/data_generation_offline.py` (`generate_and_save_hidden_states`):
  `torch.save({"input_ids": [T] long, "hidden_states": [L tensors [T, H]], "loss_mask": [T] long},
  f"{output_dir}/data_{file_idx}.pt")`, plus `data_config.json` (`save_config`, with
  `hidden_states.layer_ids` from `config_generator.py::HiddenStatesConfig`) and `sample_lengths.json`;
- capture `src/speculators/data_generation/custom_worker.py`: `aux_hidden_states.append(hidden_states +
  residual)` AFTER layer `idx` runs, i.e. each id is the OUTPUT of that layer (capture id+1);
  default ids `[2, N//2, N-3, N-1]` (`vllm_hidden_states_generator.py`), the last being the final
  layer's output before the norm;
- reader `src/speculators/train/data.py::standardize_data_v1`: features `cat(hidden_states[:-1])`,
  verifier last hidden `hidden_states[-1]`; `torch.load(mmap=True, weights_only=True)`.

Read rather than refused: the layers are recorded (data_config.json), so eyas can state them
exactly. They are one layer deeper than the same numbers in a speculators draft config (input
convention) - the note says so, and the doctor compares them with the draft's contract.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eyas.data.caches.base import PRE_NORM, UNKNOWN_ANSWERS, CacheInfo, as_ids, describe, hint_for, \
    make_sample, need
from eyas.data.caches.layers import Convention, Layers, resolve_layers
from eyas.data.caches.pickles import FileCache, load_record
from eyas.errors import FormatError

FORMAT = "speculators-legacy"
CONFIG = "data_config.json"
KEYS = ("input_ids", "loss_mask", "hidden_states[:-1]", "hidden_states[-1]")
_NAME = re.compile(r"data_(\d+)\.pt")
CONVENTION = Convention(
    trainer="legacy speculators",
    output_of_layer=True,
    default=lambda n: (2, n // 2, n - 3),
    default_text="[2, N//2, N-3] (+ N-1, the last hidden state)",
    chosen_by="data_generation_offline.py takes them from --layer-ids and saves them in data_config.json",
)
ONE_OFF = ("speculators' legacy generator stored each layer's OUTPUT: one layer deeper than the same ids in a "
           "speculators draft config")


def list_files(folder: Path) -> list[Path]:
    """`data_{i}.pt` in `folder`, by i (the generator writes them flat, numbered from 0)."""
    if folder.is_file():
        return [folder]
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name))]
    return [p for _i, p in sorted(found)]


def is_cache(folder: Path) -> bool:
    return (folder / CONFIG).is_file() and any(_NAME.fullmatch(p.name) for p in folder.iterdir())


def is_record(record: dict[str, Any]) -> bool:
    return isinstance(record.get("hidden_states"), (list, tuple)) and "input_ids" in record


def recorded_ids(folder: Path) -> list[int] | None:
    """`hidden_states.layer_ids` of data_config.json, or None without the file."""
    path = folder / CONFIG
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))["hidden_states"]["layer_ids"]
        return [int(k) for k in ids]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FormatError(f"{path}: no readable hidden_states.layer_ids ({type(e).__name__}: {e})",
                          "restore the data_config.json the generator wrote, or delete it and pass the layer ids") \
            from None


def _layers(folder: Path, stored: int, num_layers: int | None,
            layer_ids: Sequence[int] | None) -> tuple[Layers, bool]:
    """The feature layers, and whether the last stored state is the target's last layer (a last hidden state,
    not a feature). The generator appends N-1 to its ids by default and speculators' reader takes the last
    state as the verifier's; where data_config.json records ids ending elsewhere in a target of known depth,
    every stored state is a feature layer and none is the last hidden state."""
    ids = recorded_ids(folder)
    if ids is None:
        return resolve_layers(CONVENTION, stored - 1, folder, num_layers=num_layers, layer_ids=layer_ids), True
    last_is_final = num_layers is None or ids[-1] == num_layers - 1
    features, slots = (ids[:-1], stored - 1) if last_is_final else (ids, stored)
    return resolve_layers(CONVENTION, slots, folder / CONFIG, recorded=features, recorded_in=CONFIG), last_is_final


def _states(record: dict[str, Any], path: Path) -> list[Tensor]:
    states = need(record, "hidden_states", path, FORMAT)
    if not isinstance(states, (list, tuple)) or len(states) < 2 or not all(isinstance(s, Tensor) for s in states):
        raise FormatError(f"{path}: hidden_states is {describe(states)}, expected a list of >= 2 tensors [T, H]",
                          hint_for(FORMAT))
    return list(states)


class SpeculatorsLegacyCache(FileCache):
    """A legacy speculators folder of `data_{i}.pt`; samples stream one file at a time."""

    def __init__(self, path: Path, *, num_layers: int | None = None, layer_ids: Sequence[int] | None = None):
        first = self.first_record(path, list_files(path), FORMAT, "point at the --output-dir of speculators' "
                                  "legacy data_generation_offline.py (it holds data_<i>.pt files)")
        states = _states(first, self.files[0])
        folder = path if path.is_dir() else path.parent
        layers, last_is_final = _layers(folder, len(states), num_layers, layer_ids)
        note = f"{layers.note}; {ONE_OFF}"
        if not last_is_final:
            note += "; its last stored layer is not the target's last: every stored layer is a feature layer"
        slots = len(states) - 1 if last_is_final else len(states)
        self.info = CacheInfo(FORMAT, path, int(states[0].shape[-1]), slots, layers.capture,
                              layers.recorded, note, PRE_NORM if last_is_final else None, UNKNOWN_ANSWERS,
                              len(self.files))

    def read_sample(self, path: Path) -> dict[str, Tensor]:
        record = load_record(path, FORMAT)
        ids = as_ids(need(record, "input_ids", path, FORMAT), "input_ids", path, FORMAT)
        states = _states(record, path)
        last = states.pop() if self.info.last_hidden else None
        if len(states) != self.info.num_slots:
            raise FormatError(f"{path}: hidden_states holds {len(states) + (last is not None)} layers, the first "
                              f"file {self.info.num_slots + (last is not None)}", hint_for(FORMAT))
        try:
            features = torch.cat(states, dim=-1)
        except RuntimeError:
            raise FormatError(f"{path}: hidden_states are {[describe(s) for s in states]}, expected "
                              "equal [T, H]", hint_for(FORMAT)) from None
        return make_sample(self.info, path, ids, need(record, "loss_mask", path, FORMAT), features, last, KEYS)
