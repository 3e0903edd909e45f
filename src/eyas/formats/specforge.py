"""Fields only a SpecForge branch writes into a flat EAGLE-3 config, read from its source
(`specforge/modeling/draft/llama3_eagle.py` at ceefdebd and 078d71c2; SpecForge's later HEAD has neither).

- `use_aux_norm`: one RMSNorm per captured state before fc, stored as `aux_norm_low/mid/high`: fc_norm
  under other names (eyas.weights reads the tensors as `fc_norm.0/1/2`). At 078d71c2 the norms are
  always on, flag or not: its weights then carry them and the tensor check names fc_norm.
- `embed_scale`, or `target_model_type` naming a Gemma target: the draft's token embeddings are
  multiplied by it (by sqrt(hidden_size) for Gemma) in training. No engine's EAGLE-3 draft scales them,
  nor does eyas, which runs drafts as the engines do: such a draft is served on other embeddings.
  eyas keeps both fields (contract `embed_scale`, `verifier.model_type`) and writes them again, in either
  format (vLLM's speculators reader ignores top-level fields it does not know), so a converted draft is
  warned as its source was.
"""

from __future__ import annotations

from typing import Any

from eyas.formats.values import flag, show

SCALED_FIX = "if the draft was trained on scaled embeddings, retrain it unscaled for serving"


def use_aux_norm(file: str, cfg: dict[str, Any]) -> bool | None:
    """The config's `use_aux_norm` (fc_norm's value), or None when it does not say."""
    return None if cfg.get("use_aux_norm") is None else flag(file, "use_aux_norm", cfg["use_aux_norm"])


def embed_scale(scale: float | None, target_type: str | None, hidden_size: int) -> tuple[str, str] | None:
    """(field, why) when the trainer scaled the token embeddings, or may have; None when it did not.

    `scale` and `target_type` as the config states them (`embed_scale`, `target_model_type`); a stated
    scale of 1 says unscaled whatever the target."""
    if scale is not None:
        if scale == 1:
            return None
        why = f"embed_scale {show(scale)}: its trainer multiplied the draft's token embeddings by it"
        return "embed_scale", why + _UNSCALED
    if target_type is not None and "gemma" in target_type.lower():
        why = (f"target_model_type {target_type!r}: the trainer that writes it multiplied a Gemma target's draft's "
               f"token embeddings by sqrt(hidden_size) = {hidden_size ** 0.5:.1f} in some versions "
               "(eyas.formats.specforge)")
        return "target_model_type", why + _UNSCALED
    return None


# (findings outside the consumer views name no engine or trainer: tests/test_config_corpus.py)
_UNSCALED = "; no serving engine's EAGLE-3 draft scales them, nor eyas, which runs drafts as they do"
