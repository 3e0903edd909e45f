"""Writers of other trainers' feature caches, from a Hugging Face target, as those trainers write them.

Each function runs the target the way the trainer's capture does (which layers, which convention,
normed or not, padded or not) and stores the result with the trainer's own keys, dtypes, shapes,
batch dims and file names. The trainers' code was read, not copied; the lines cited are where each
fact comes from (commits as in src/eyas/data/caches/*.py):
    SpecForge    sgl-project/SpecForge @a6b6b0230009d15ec2a97a57384e6f53f0f96946
    speculators  vllm-project/speculators @c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b (legacy: @21180f6a)
    ModelOpt     NVIDIA/Model-Optimizer @a2fbac7bad8ab446d3f8783dadb0c3366eb0ad73

A row is (input_ids [T] int64, loss_mask [T] int64). `model` is a transformers LlamaForCausalLM.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from eyas.data.shards import record_shards, shard_name, start_manifest, write_shard

Row = tuple[Tensor, Tensor]


@torch.no_grad()
def hf_states(model, ids: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
    """HF `output_hidden_states` for one sequence ([T, H] each; entry N is after the final norm) and
    the last layer's output before the norm (a pre-hook on the norm: it is not in HF's tuple)."""
    seen: dict[str, Tensor] = {}
    hook = model.model.norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__("x", args[0]))
    try:
        out = model(ids[None], output_hidden_states=True, use_cache=False)
    finally:
        hook.remove()
    return tuple(h[0] for h in out.hidden_states), seen["x"][0]


# --- SpecForge: scripts/prepare_hidden_states.py -------------------------------------------------


def specforge_default_ids(n: int) -> list[int]:
    # specforge/algorithms/model_providers.py::resolve_eagle_capture_layers (no run or draft-config ids)
    return [1, n // 2 - 1, n - 4]


def write_specforge(model, rows: Sequence[Row], out: Path, *, layer_ids: Sequence[int] | None = None,
                    batch_size: int = 2, group_size: int = 2000, compress: bool = False) -> list[Path]:
    """`prepare_hidden_states.py`: one `rows_{g}-{g+G}/data_{idx}.ckpt[.gz]` per row, padded rows included."""
    n = model.config.num_hidden_layers
    ids_out = list(layer_ids) if layer_ids is not None else specforge_default_ids(n)
    # SGLang captures id k at the input of layer k + 1 (`layers_to_capture = [val + 1 ...]`): no id reaches N - 1,
    # whose HF state (hidden_states[N]) is after the final norm
    assert all(0 <= k < n - 1 for k in ids_out), f"SGLang cannot capture ids {ids_out} of a {n}-layer target"
    written = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        # specforge/data/utils.py::DataCollatorWithPadding.paddingtensor2D: right-pad with zeros to the batch max
        T = max(len(ids) for ids, _ in batch)
        for i, (ids, mask) in enumerate(batch):
            pad = torch.zeros(T - len(ids), dtype=torch.long)
            row_ids, row_mask = torch.cat([ids, pad]), torch.cat([mask, pad])
            # sglang_backend/capture.py:189: the whole padded row is the request's prompt (no attention mask)
            hs, _ = hf_states(model, row_ids)
            # SGLang `layers_to_capture = [val + 1 ...]`: id k is HF hidden_states[k + 1]
            aux = torch.cat([hs[k + 1] for k in ids_out], dim=-1)
            last = hs[n]  # sglang_backend/utils.py:90 `last_hidden_states=pruned_states`: after the final norm
            record = {  # OfflineCaptureLayout in specforge/algorithms/eagle3/providers.py
                "input_ids": row_ids.clone(),  # [T] (prepare_hidden_states.py `filtered_batch["input_ids"][i]`)
                "loss_mask": row_mask.clone(),  # [T] int64
                "aux_hidden_state": aux.clone().unsqueeze(0),  # [1, T, 3H] (prepare_hidden_states.py:710)
                "hidden_state": last.clone().unsqueeze(0),  # [1, T, H] (prepare_hidden_states.py:715)
            }
            written.append(save_specforge_record(out, start + i, record, group_size=group_size, compress=compress))
    return written


def save_specforge_record(out: Path, idx: int, record: dict[str, Tensor], *, group_size: int = 2000,
                          compress: bool = False) -> Path:
    """One sample where `prepare_hidden_states.py` puts it (HiddenStatesGenerator._get_file_path)."""
    g = (idx // group_size) * group_size
    path = out / f"rows_{g}-{g + group_size}" / f"data_{idx}{'.ckpt.gz' if compress else '.ckpt'}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:  # _save_tensor_sync: gzip.open(..., compresslevel) then torch.save into it
        with gzip.open(path, "wb", compresslevel=6) as f:
            torch.save(record, f)
    else:
        torch.save(record, path)
    return path


def write_specforge_records(out: Path, records: Sequence[dict[str, Tensor]]) -> list[Path]:
    """Records already in SpecForge's keys and shapes (random features at a real width, for costs)."""
    return [save_specforge_record(out, i, r) for i, r in enumerate(records)]


# --- speculators: prepare_data.py + launch_vllm.py + data_generation_offline.py -------------------


def vllm_default_ids(n: int) -> list[int]:
    # scripts/launch_vllm.py::main: [2, N//2, N-3] + [N] (--include-last-layer, default True)
    return [2, n // 2, n - 3, n]


def write_speculators(model, rows: Sequence[Row], out: Path, *, layer_ids: Sequence[int] | None = None,
                      skip: Sequence[int] = ()) -> None:
    """The Arrow dataset of prepare_data.py, then one vLLM connector file per row (rows in `skip` left out,
    as data_generation_offline.py leaves out rows that failed)."""
    from datasets import Dataset

    def preprocess(batch):  # preprocessing.py:358-360: lists of long tensors and seq_len
        chosen = [rows[i] for i in batch["row"]]
        return {"input_ids": [ids.clone() for ids, _ in chosen], "loss_mask": [m.clone() for _, m in chosen],
                "seq_len": [len(ids) for ids, _ in chosen]}

    ds = Dataset.from_dict({"row": list(range(len(rows)))})
    ds = ds.map(preprocess, batched=True, remove_columns=["row"], keep_in_memory=True)
    ds.set_format(type="torch")  # preprocessing.py:589
    ds.save_to_disk(str(out))  # prepare_data.py:253
    n = model.config.num_hidden_layers
    ids_vllm = list(layer_ids) if layer_ids is not None else vllm_default_ids(n)
    (out / "hidden_states").mkdir()
    for idx, (ids, _) in enumerate(rows):
        if idx in skip:
            continue
        hs, pre = hf_states(model, ids)
        # vLLM `_maybe_add_hidden_state(aux, idx + 1, h, residual)`: id k < N is HF hidden_states[k]; id N is
        # the last layer's output before the norm. extract_hidden_states.py stacks them on dim 1: [T, L, H]
        stack = torch.stack([pre if k == n else hs[k] for k in ids_vllm], dim=1)
        # example_hidden_states_connector.py `_submit_async_write`: {"hidden_states", "token_ids"}, save_file;
        # data_generation_offline.py:227 moves it to hidden_states/hs_{idx}.safetensors
        save_file({"hidden_states": stack.contiguous(), "token_ids": ids.clone()},
                  str(out / "hidden_states" / f"hs_{idx}.safetensors"))


def write_speculators_legacy(model, rows: Sequence[Row], out: Path, *, layer_ids: Sequence[int] | None = None,
                             with_config: bool = True) -> None:
    """speculators @21180f6a scripts/data_generation_offline.py: data_{i}.pt, data_config.json, sample_lengths.json."""
    n = model.config.num_hidden_layers
    # vllm_hidden_states_generator.py:103 default; custom_worker.py appends hidden+residual AFTER layer k
    ids_out = list(layer_ids) if layer_ids is not None else [2, n // 2, n - 3, n - 1]
    out.mkdir(parents=True, exist_ok=True)
    lengths = {}
    for idx, (ids, mask) in enumerate(rows):
        hs, pre = hf_states(model, ids)
        states = [pre.clone() if k == n - 1 else hs[k + 1].clone() for k in ids_out]  # output of layer k
        torch.save({"input_ids": ids.clone(), "hidden_states": states, "loss_mask": mask.clone()},
                   out / f"data_{idx}.pt")
        lengths[str(idx)] = len(ids)
    (out / "sample_lengths.json").write_text(json.dumps(lengths, indent=2))
    if with_config:  # save_config + config_generator.py::DataGenerationConfig (abridged to what is read)
        config = {"version": "2.0", "hidden_states": {"layer_ids": ids_out, "description": "Layers selected for "
                  "EAGLE3 fusion and target logits"}, "format": {"file_pattern": "data_{idx}.pt",
                  "data_format_version": 1}}
        (out / "data_config.json").write_text(json.dumps(config, indent=2))


# --- ModelOpt: examples/speculative_decoding/collect_hidden_states/compute_hidden_states_hf.py ----


def write_modelopt(model, rows: Sequence[Row], out: Path, *, prenorm: bool = False) -> None:
    """One `{conversation_id}.pt` per row (`dump_hidden_states`); `prenorm` adds the reader's optional
    `hidden_states_prenorm` flag and stores the state before the norm."""
    n = model.config.num_hidden_layers
    selected = sorted({1, max(0, n // 2 - 1), max(0, n - 4)})  # hf_eagle.py::default_eagle_aux_layer_ids
    out.mkdir(parents=True, exist_ok=True)
    for cid, (ids, mask) in enumerate(rows):
        hs, pre = hf_states(model, ids)  # the writer runs AutoModel: the same base-model hidden states
        record = {
            "input_ids": ids.clone(),
            "hidden_states": pre.clone() if prenorm else hs[-1].clone(),  # hidden_states[-1]: after the norm
            "aux_hidden_states": torch.cat([hs[lid + 1] for lid in selected], dim=-1),  # layer lid -> index lid+1
            "loss_mask": mask.clone(),
            "conversation_id": cid,
        }
        if prenorm:
            record["hidden_states_prenorm"] = True
        with open(out / f"{cid}.pt", "wb") as f:
            torch.save(record, f)


# --- eyas: capture shards and engine dumps -------------------------------------------------------


def write_eyas_shards(target, rows: Sequence[Row], out: Path, layers: Sequence[int]) -> None:
    """One shard, written with eyas.data.shards' own functions, as `eyas capture` does."""
    plan = {"format": "eyas-capture", "format_version": 2,
            "target": {"name": target.name, "num_layers": target.num_layers, "hidden_size": target.hidden_size,
                       "vocab_size": target.vocab_size},
            "capture_layers": list(layers), "dtype": "float32", "shard_size": len(rows),
            "prompts": {"count": len(rows), "sha256": "0" * 64, "sources": ["test"], "eval_only": False},
            "generation": {"max_new_tokens": 8, "do_sample": False, "temperature": 0.0}}
    manifest = start_manifest(out, plan, [])
    samples = []
    for ids, mask in rows:
        o = target.forward(ids[None], layers, with_logits=False)
        samples.append({"input_ids": ids, "loss_mask": mask.bool(), "features": o.features[0],
                        "last_hidden": o.last_hidden[0]})
    entry = write_shard(out, {"index": 0, "file": shard_name(0), "prompts": [0, len(rows)]},
                        list(range(len(rows))), samples, manifest["fingerprint"])
    record_shards(out, manifest, {0: entry}, complete=True)


def write_dump(path: Path, ids: Tensor, features: Tensor) -> None:
    """docs/engine-dumps.md: input_ids [T] int64, features [T, W]."""
    save_file({"input_ids": ids.clone(), "features": features.contiguous()}, str(path))
