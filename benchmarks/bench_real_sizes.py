"""What a draft at the size people train costs eyas: load time, peak memory, eval positions/s, doctor
wall time, and what 1M tokens of features take on disk.

Each shape is a real published EAGLE-3 draft config (SpecForge `configs/`, copied with their commits
into tests/data/configs/specforge/, SOURCES.md) with random
weights, judged against a stand-in target folder holding only what eyas reads from a target when its
features are cached (`embed_tokens`, the final `norm`, `lm_head`, at the target's real vocabulary),
on a SpecForge-format cache of random features written here. Random weights make acceptance
meaningless but cost exact. Each shape runs in its own process, so peak memory is that shape's.

    python benchmarks/bench_real_sizes.py [--shapes llama-3.1-8b,qwen3-235b,deepseek-v3] [--device cpu]
        [--samples 4 --tokens 512] [--temperature T] [--no-doctor] [--out /tmp/eyas-real-sizes] [--json]

`--temperature T` evaluates as `eyas eval --temperature T` does (the expected acceptance when serving
samples, beside the greedy numbers); `--no-doctor` skips the doctor, so peak memory is eval's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from eyas.bench import git_commit
from eyas.jsonsafe import dumps
from eyas.machine import cpu_class, cpu_model
import flags

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the cache writers the tests use (the trainers' layouts)

CORPUS = HERE.parent / "tests" / "data" / "configs" / "specforge"  # published configs (SOURCES.md: commits)
# name: (the published draft config, the target's decoder layers N)
SHAPES = {
    "llama-3.1-8b": ("llama3-8B-eagle3.json", 32),
    "qwen3-235b": ("qwen3-235B-A22B-eagle3.json", 94),
    "deepseek-v3": ("deepseek-v3-671b-eagle3.json", 61),
    "kimi-k2": ("kimi-k2-eagle3.json", 61),
}
_DIMS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size",
         "draft_vocab_size", "rms_norm_eps")


def dims_of(shape: str) -> dict:
    """The draft's dimensions as its published config states them (head_dim and rope theta defaulted
    as Llama does when absent)."""
    cfg = json.loads((CORPUS / SHAPES[shape][0]).read_text())
    dims = {k: cfg[k] for k in _DIMS}
    dims["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dims["rope_theta"] = float(cfg.get("rope_theta") or 10000.0)
    return dims


def bytes_per_token(hidden: int, slots: int = 3, itemsize: int = 2) -> int:
    """A cached token: `slots` captured states and the last hidden state in bf16, plus int64 id and mask."""
    return (slots + 1) * hidden * itemsize + 16


def build(shape: str, root: Path, samples: int, tokens: int) -> tuple[Path, Path, Path]:
    """The draft (random, bf16, speculators format), the target stand-in and a SpecForge cache."""
    from cache_writers import write_specforge_records
    from conftest import random_tensors

    from eyas.contract import DraftContract, Verifier, default_capture_layers
    from eyas.formats import write_checkpoint
    from eyas.weights import write_tensors

    dims, N = dims_of(shape), SHAPES[shape][1]
    H, V = dims["hidden_size"], dims["vocab_size"]
    layers = default_capture_layers(N)
    contract = DraftContract(**dims, target_hidden_size=H, capture_layers=layers, max_position_embeddings=4096,
                             has_vocab_map=True, verifier=Verifier(name_or_path=f"stand-in/{shape}",
                             architectures=("LlamaForCausalLM",), num_hidden_layers=N, hidden_size=H, vocab_size=V))
    g = torch.Generator().manual_seed(0)
    tensors = random_tensors(contract, dtype=torch.bfloat16)
    draft = root / shape / "draft"
    if not (draft / "config.json").is_file():
        write_checkpoint(draft, contract, tensors, "speculators")
    del tensors
    target = root / shape / "target"
    if not (target / "config.json").is_file():
        target.mkdir(parents=True, exist_ok=True)
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": N, "hidden_size": H,
               "vocab_size": V, "rms_norm_eps": dims["rms_norm_eps"], "tie_word_embeddings": False}
        (target / "config.json").write_text(json.dumps(cfg))
        write_tensors(target, {"model.embed_tokens.weight": 0.02 * torch.randn(V, H, generator=g, dtype=torch.bfloat16),
                               "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
                               "lm_head.weight": 0.02 * torch.randn(V, H, generator=g, dtype=torch.bfloat16)})
    cache = root / shape / "cache"
    if not cache.is_dir():
        recs = []
        for i in range(samples):
            ids = torch.randint(0, V, (tokens,), generator=g)
            mask = torch.zeros(tokens, dtype=torch.long)
            mask[tokens // 4:] = 1
            # SpecForge's keys and shapes: [T], [T], [1, T, 3H], [1, T, H]
            recs.append({"input_ids": ids, "loss_mask": mask,
                         "aux_hidden_state": torch.randn(1, tokens, 3 * H, generator=g, dtype=torch.bfloat16),
                         "hidden_state": torch.randn(1, tokens, H, generator=g, dtype=torch.bfloat16)})
        write_specforge_records(cache, recs)
    return draft, target, cache


def measure(shape: str, root: Path, device: str, samples: int, tokens: int, temperature: float = 0.0,
            doctor: bool = True) -> dict:
    """One shape, in this process: build (not timed), then load, eval and doctor (timed)."""
    from eyas.doctor import diagnose
    from eyas.drafter_loading import load_drafter_and_config
    from eyas.evaluate import evaluate
    from eyas.target_ref import TargetRef

    draft, target, cache = build(shape, root, samples, tokens)
    ref = TargetRef.resolve(target, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    drafter, _ = load_drafter_and_config(draft, target=ref, dtype=torch.bfloat16)
    load_s = time.perf_counter() - t0
    params = sum(p.numel() for p in drafter.parameters())
    del drafter
    rep = evaluate(draft, data=cache, target=ref, dtype=torch.bfloat16, device=device, temperature=temperature,
                   progress=False)
    t1 = time.perf_counter()
    doc = (diagnose(draft, target=target, features=cache, device=device, limit=samples, progress=False)
           if doctor else None)
    doctor_s = time.perf_counter() - t1 if doctor else None
    dims = dims_of(shape)
    return {"shape": shape, "source": f"tests/data/configs/specforge/{SHAPES[shape][0]}", "device": device,
            "draft_params": params,
            "draft_bytes_bf16": sum(f.stat().st_size for f in draft.glob("*.safetensors")),
            "load_s": round(load_s, 2), "eval_positions": rep["tokens"], "eval_s": rep["cost"]["measure_seconds"],
            "eval_positions_per_s": rep["cost"]["positions_per_s"], "eval_total_s": rep["cost"]["seconds"],
            "temperature": temperature, "doctor_s": doctor_s and round(doctor_s, 1),
            "doctor_verdict": doc and doc["verdict"],
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device != "cpu" else None,
            "cache_gb_per_1m_tokens": round(bytes_per_token(dims["hidden_size"]) * 1e6 / 1e9, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama-3.1-8b,qwen3-235b,deepseek-v3")
    ap.add_argument("--device", type=flags.device, default="cpu")
    ap.add_argument("--samples", type=flags.count, default=4)
    ap.add_argument("--tokens", type=flags.count, default=512)
    ap.add_argument("--temperature", type=flags.temperature, default=0.0,
                    help="also the sampled measures, as eval --temperature")
    ap.add_argument("--no-doctor", action="store_true", help="skip the doctor: peak memory is eval's alone")
    ap.add_argument("--out", default="/tmp/eyas-real-sizes", help="where drafts, stand-ins and caches are written")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one shape in this process
    a = ap.parse_args()
    root = Path(a.out)
    if a.one:
        flags.emit(measure(a.one, root, a.device, a.samples, a.tokens, a.temperature, not a.no_doctor))
        return
    rows = []
    for shape in a.shapes.split(","):
        cmd = [sys.executable, __file__, "--one", shape, "--device", a.device, "--samples", str(a.samples),
               "--tokens", str(a.tokens), "--out", str(root), "--temperature", str(a.temperature),
               *(["--no-doctor"] if a.no_doctor else [])]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "EYAS_DEBUG": "1"})
        if out.returncode:
            sys.exit(f"{shape} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    machine = {"cpu": cpu_model(), "cpu_class": cpu_class(), "threads": torch.get_num_threads(),
               "torch": torch.__version__, "commit": git_commit()}
    if a.json:
        print(dumps({"machine": machine, "rows": rows}, indent=2))
        return
    print(f"machine: {machine}")
    print("| shape | draft params | draft on disk (bf16) | load s | peak RSS GiB | eval positions/s | doctor s "
          "| features per 1M tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['draft_params'] / 1e9:.2f} B | {r['draft_bytes_bf16'] / 2**30:.1f} GiB | "
              f"{r['load_s']} | {r['peak_rss_gib']} | {r['eval_positions_per_s']} | {r['doctor_s']} | "
              f"{r['cache_gb_per_1m_tokens']} GB |")


if __name__ == "__main__":
    sys.exit(flags.run(main))
