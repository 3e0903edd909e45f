"""speculators' data-generation output: an Arrow dataset plus `hidden_states/hs_{row}.safetensors`.

Read from vllm-project/speculators @ c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b (main, 2026-08-20):
- `scripts/prepare_data.py` / `src/speculators/data_generation/preprocessing.py`: the rows
  (`input_ids`, `loss_mask`, `seq_len`), `dataset.set_format("torch")`, `dataset.save_to_disk(output)`;
- `scripts/launch_vllm.py::main`: vLLM serves with `extract_hidden_states` and
  `eagle_aux_hidden_state_layer_ids = --target-layer-ids or [2, N//2, N-3]`, plus `N` appended
  (`--include-last-layer`, default True). vLLM ids are "input of layer k" (= eyas's capture k), and
  id N is the last layer's output BEFORE the final norm;
- `scripts/data_generation_offline.py`: row `idx`'s file is moved to
  `<data>/hidden_states/hs_{idx}.safetensors`; its content is vLLM's
  `ExampleHiddenStatesConnector` file: `token_ids` [T] int64, `hidden_states` [T, L, H] (the
  captured layers stacked on dim 1, ascending), no metadata: the layer ids are recorded nowhere;
- reader `src/speculators/train/data.py::ArrowDataset._get_raw_data`: `torch.equal(token_ids,
  row input_ids)` (a mismatch drops the sample there; eyas refuses it), features
  `hidden_states[:, :-1].flatten(1)`, verifier last hidden `hidden_states[:, -1]`, which
  `src/speculators/models/eagle3/core.py` passes through `verifier_norm` before `lm_head`;
  files by `hs_connectors/src/hs_connectors/transfer.py::FileTransfer.get_cached`.
A missing `hs_{i}` (the generator skips rows that failed) is skipped here with one warning.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from torch import Tensor

from eyas.data.caches import arrow
from eyas.data.caches.base import PRE_NORM, UNKNOWN_ANSWERS, CacheInfo, FeatureCache, as_ids, describe, hint_for, \
    make_sample, need, read_tensors, safetensors_shapes
from eyas.data.caches.layers import Convention, resolve_layers
from eyas.errors import FormatError

FORMAT = "speculators"
HS_DIR = "hidden_states"
KEYS = ("token_ids", "loss_mask", "hidden_states[:, :-1]", "hidden_states[:, -1]")
_HS_NAME = re.compile(r"hs_(\d+)\.safetensors")
CONVENTION = Convention(
    trainer="speculators",
    output_of_layer=False,
    default=lambda n: (2, n // 2, n - 3),
    default_text="[2, N//2, N-3] (+ N, the last hidden state)",
    chosen_by="launch_vllm.py takes them from --target-layer-ids, else this default",
)


def is_cache(folder: Path) -> bool:
    return arrow.is_dataset(folder) and (folder / HS_DIR).is_dir()


def present_rows(hs_dir: Path) -> set[int]:
    return {int(m.group(1)) for p in hs_dir.iterdir() if (m := _HS_NAME.fullmatch(p.name))}


def _stack_shape(path: Path) -> tuple[int, int]:
    """(L, H) of a file's `hidden_states` [T, L, H], from its header only."""
    shape = safetensors_shapes(path, "generate this row's hidden states again").get("hidden_states")
    if shape is None or len(shape) != 3 or shape[1] < 2:
        raise FormatError(f"{path}: hidden_states is {shape}, expected [T, L, H] with L >= 2 (layers + the last "
                          "hidden state)", hint_for(FORMAT))
    return int(shape[1]), int(shape[2])


class SpeculatorsCache(FeatureCache):
    """A speculators data folder; rows stream in dataset order, one safetensors file at a time."""

    def __init__(self, path: Path, *, num_layers: int | None = None, layer_ids: Sequence[int] | None = None):
        self.hs_dir = path / HS_DIR
        total = arrow.num_rows(path)
        self.present = {i for i in present_rows(self.hs_dir) if i < total}
        if not self.present:
            raise FormatError(f"{self.hs_dir}: no hs_<row>.safetensors for any of the {total} rows",
                              "run speculators' scripts/data_generation_offline.py on this dataset first")
        if len(self.present) < total:
            first = min(set(range(total)) - self.present)
            warnings.warn(f"{self.hs_dir}: {total - len(self.present)} of {total} rows have no hidden states "
                          f"(first: hs_{first}.safetensors); they are skipped", stacklevel=3)
        L, H = _stack_shape(self.hs_dir / f"hs_{min(self.present)}.safetensors")
        if layer_ids is not None and len(layer_ids) == L:  # vLLM's full list, the last-hidden id N included
            layer_ids = list(layer_ids)[:-1]
        layers = resolve_layers(CONVENTION, L - 1, path, num_layers=num_layers, layer_ids=layer_ids)
        note = f"{layers.note}; the last of the {L} stored layers is the last hidden state (before the final norm)"
        self.info = CacheInfo(FORMAT, path, H, L - 1, layers.capture, layers.recorded, note, PRE_NORM,
                              UNKNOWN_ANSWERS, len(self.present))

    def __len__(self) -> int:
        return len(self.present)

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        for index, (arrow_file, row) in enumerate(arrow.rows(self.info.path, ("input_ids", "loss_mask"),
                                                                        masks=("loss_mask",))):
            if index in self.present:
                yield self.read_sample(index, arrow_file, row)

    def read_sample(self, index: int, arrow_file: Path, row: dict[str, Tensor]) -> dict[str, Tensor]:
        path = self.hs_dir / f"hs_{index}.safetensors"
        t = read_tensors(path, "generate this row's hidden states again")
        ids = as_ids(need(t, "token_ids", path, FORMAT), "token_ids", path, FORMAT)
        if not (ids.shape == row["input_ids"].shape and bool((ids == row["input_ids"]).all())):
            raise FormatError(f"{path}: token_ids ({len(ids)} tokens) differ from input_ids of row {index} in "
                              f"{arrow_file} ({len(row['input_ids'])} tokens)",
                              "the hidden states were generated from another dataset: generate them again")
        if row["loss_mask"].shape != ids.shape:
            raise FormatError(f"{arrow_file}: row {index} has {len(row['loss_mask'])} loss_mask entries for "
                              f"{len(ids)} input_ids", "prepare the dataset again with speculators' prepare_data.py")
        hs = need(t, "hidden_states", path, FORMAT)
        if not isinstance(hs, Tensor) or hs.ndim != 3 or hs.shape[1] != self.info.num_slots + 1:
            raise FormatError(f"{path}: hidden_states is {describe(hs)}, expected [T, {self.info.num_slots + 1}, "
                              f"{self.info.hidden_size}]", hint_for(FORMAT))
        return make_sample(self.info, path, ids, row["loss_mask"], hs[:, :-1].reshape(hs.shape[0], -1), hs[:, -1],
                           KEYS)
