"""Offline checks of a draft checkpoint, and what each serving engine will actually do with it.

- `consumers`: what vLLM, SGLang (current and legacy), speculators and llama.cpp load and how they wire
  the draft (`consumers`, `consumer_warnings`); each engine's statements are made in its view only
  (`sglang`, `llamacpp` hold the views read from those engines' sources; `view` their shared shape).
- `rules`: the contract against a target's config (`target_problems`) and on its own (`contract_problems`).
- `report`: `check_checkpoint` (what `eyas check` prints) and its `CheckReport`.

The tensor and vocab-map rules are eyas.formats.validate's; every finding carries a code from eyas.codes.
"""

from eyas.check.consumers import ENGINE_CONFIG, consumer_warnings, consumers
from eyas.check.report import CheckReport, check_checkpoint, draft_warnings
from eyas.check.rules import contract_problems, target_problems

__all__ = [
    "ENGINE_CONFIG",
    "CheckReport",
    "check_checkpoint",
    "consumer_warnings",
    "consumers",
    "contract_problems",
    "draft_warnings",
    "target_problems",
]
