"""The on-disk vocabulary of EAGLE-3 draft configs: file and format names, keys, which format a config is.

Two formats exist:

- "speculators": `config.json` with `speculators_model_type`, `speculators_config` and a nested
  `transformer_layer_config`; no top-level `model_type` (vLLM relies on that to detect it). Layer ids
  are top-level `eagle_aux_hidden_state_layer_ids` (`eyas.contract.IDS`), already capture indices.
- "eagle": the flat `LlamaForCausalLMEagle3` config of SafeAILab/EAGLE, SpecForge and SGLang, with
  `draft_vocab_size`, optional `target_hidden_size` and an optional nested `eagle_config`. Its nested
  layer ids are ambiguous: "output of layer i" for SpecForge and legacy SGLang (+1 to capture),
  +1 only when the first id is 1 for SGLang since sgl-project/sglang PR #25454 (what each engine does
  with them is eyas.check.consumers', stated there once).
"""

from __future__ import annotations

from typing import Any

FORMATS = ("speculators", "eagle")
CONFIG_NAMES = ("config.json", "config_speculators.json", "config_eagle.json")  # looked for, in order
LAYER_CONVENTIONS = ("input", "output")  # how nested eagle_config ids are read (None: current SGLang rule)
NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
EAGLE_ARCH = "LlamaForCausalLMEagle3"  # SGLang picks its draft class by this name


def detect_format(cfg: dict[str, Any]) -> str | None:
    """The format of a config dict: "speculators", "eagle", or None (neither, e.g. a target model's)."""
    if "speculators_model_type" in cfg or "speculators_config" in cfg:
        return "speculators"
    archs = cfg.get("architectures")
    archs = archs if isinstance(archs, list) else []  # a malformed list is the parser's to report
    if "draft_vocab_size" in cfg or "eagle_config" in cfg or any("eagle3" in str(a).lower() for a in archs):
        return "eagle"
    if any(str(a).endswith("NextN") for a in archs):  # a NextN layer exported as a draft (SpecForge's first kimi-k2)
        return "eagle"
    return None
