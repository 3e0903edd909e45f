"""NVIDIA ModelOpt's offline EAGLE data: one `torch.save` dict per conversation, `{conversation_id}.pt`.

Read from NVIDIA/Model-Optimizer @ a2fbac7bad8ab446d3f8783dadb0c3366eb0ad73 (2026-08-21):
- writer `examples/speculative_decoding/collect_hidden_states/compute_hidden_states_hf.py`
  (`dump_hidden_states`): `AutoModel(...)(input_ids, output_hidden_states=True)`, then
  `aux_hidden_states = cat([hidden_states[lid + 1] ...])` [T, A*H] (layer ids = the OUTPUT of layer
  lid), `hidden_states = hidden_states[-1]` [T, H] (transformers' last entry: after the final norm),
  `input_ids` [T], `loss_mask` [T] (all ones unless `--answer-only-loss`), `conversation_id`; no
  batch dim, no padding;
- layers `common.py::resolve_aux_layers` (`--aux-layers`, default "eagle" =
  `modelopt/torch/speculative/plugins/hf_eagle.py::default_eagle_aux_layer_ids`:
  `sorted({1, max(0, N//2-1), max(0, N-4)})`); nothing on disk records them;
- reader `modelopt/torch/speculative/eagle/utils.py::OfflineSupervisedDataset.__getitem__`
  (`torch.load(weights_only=True)`; an optional `hidden_states_prenorm` flag says the stored last
  state is before the final norm), files from `Path(offline_data_path).rglob("*.pt")`
  (`examples/speculative_decoding/eagle_utils.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eyas.data.caches.base import NORMED, PRE_NORM, UNKNOWN_ANSWERS, CacheInfo, as_ids, make_sample, \
    need, slots_of
from eyas.data.caches.layers import Convention, resolve_layers
from eyas.data.caches.pickles import FileCache, load_record
from eyas.errors import FormatError

FORMAT = "modelopt"
KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states")
CONVENTION = Convention(
    trainer="ModelOpt",
    output_of_layer=True,
    default=lambda n: sorted({1, max(0, n // 2 - 1), max(0, n - 4)}),
    default_text="sorted({1, N//2-1, N-4})",
    chosen_by="compute_hidden_states_hf.py takes them from --aux-layers, default 'eagle'",
)


def list_files(folder: Path) -> list[Path]:
    """Every `*.pt` below `folder`, sorted (ModelOpt's rglob order is the filesystem's)."""
    return [folder] if folder.is_file() else sorted(folder.rglob("*.pt"))


def is_record(record: dict[str, Any]) -> bool:
    return {"input_ids", "hidden_states", "aux_hidden_states"} <= set(record)


def _norm_state(record: dict[str, Any]) -> str:
    return PRE_NORM if bool(record.get("hidden_states_prenorm", False)) else NORMED


class ModelOptCache(FileCache):
    """A folder of ModelOpt `.pt` dumps (or one); samples stream one file at a time."""

    def __init__(self, path: Path, *, num_layers: int | None = None, layer_ids: Sequence[int] | None = None):
        first = self.first_record(path, list_files(path), FORMAT, "point at the --output-dir of ModelOpt's "
                                  "compute_hidden_states_hf.py (it holds <conversation_id>.pt files)")
        H, slots = slots_of(first, "aux_hidden_states", "hidden_states", self.files[0], FORMAT)
        layers = resolve_layers(CONVENTION, slots, path, num_layers=num_layers, layer_ids=layer_ids)
        self.info = CacheInfo(FORMAT, path, H, slots, layers.capture, layers.recorded, layers.note,
                              _norm_state(first), UNKNOWN_ANSWERS, len(self.files))

    def read_sample(self, path: Path) -> dict[str, Tensor]:
        record = load_record(path, FORMAT)
        ids = as_ids(need(record, "input_ids", path, FORMAT), "input_ids", path, FORMAT)
        if _norm_state(record) != self.info.last_hidden:
            raise FormatError(f"{path}: hidden_states_prenorm is {record.get('hidden_states_prenorm', False)}, "
                              f"the first file's last state is {self.info.last_hidden}",
                              "write the whole cache with one ModelOpt writer")
        mask = record.get("loss_mask", torch.ones_like(ids))  # ModelOpt trains on every token without one
        return make_sample(self.info, path, ids, mask, need(record, "aux_hidden_states", path, FORMAT),
                           need(record, "hidden_states", path, FORMAT), KEYS)
