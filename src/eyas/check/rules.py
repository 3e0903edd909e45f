"""Checks of a draft's contract that its tensors cannot show: against a target's config, and on its own.

Each returns findings (eyas.codes): the code, the field, what is wrong and the fix.
"""

from __future__ import annotations

import re
from typing import Any

from eyas.codes import finding
from eyas.contract import DraftContract, capture_layer_problems
from eyas.formats import Checkpoint

_PORTABLE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # a hub id: name or owner/name
_OTHER_TARGET = "use a draft made for this target"
_HUB_ID = "record the target's hub id: eyas convert SRC DST --format speculators --verifier-name ORG/MODEL"


def target_problems(c: DraftContract, tgt: dict[str, Any]) -> list[dict[str, str]]:
    """The contract against a target's facts (`eyas.contract.target_facts`): vocab, width, depth, context, identity."""
    out = []
    V, H, N = tgt.get("vocab_size"), tgt.get("hidden_size"), tgt.get("num_hidden_layers")
    if V is not None and c.vocab_size != V:
        out.append(
            finding(
                "target_vocab_size",
                "vocab_size",
                f"draft vocab_size {c.vocab_size} != target vocab_size {V}",
                "vocab_size is the TARGET's vocabulary: the draft was made for another target, or the config is wrong",
            )
        )
    if V is not None and c.draft_vocab_size > V:
        out.append(
            finding(
                "target_draft_vocab_size",
                "draft_vocab_size",
                f"draft_vocab_size {c.draft_vocab_size} exceeds the target vocab {V}",
                _OTHER_TARGET,
            )
        )
    if H is not None and c.target_hidden_size != H:
        out.append(
            finding(
                "target_hidden_size",
                "target_hidden_size",
                f"the draft reads target states of width {c.target_hidden_size}, the target's hidden_size is {H}",
                _OTHER_TARGET,
            )
        )
    if H is not None and c.hidden_size != H and not c.has_embeddings and c.target_hidden_size == c.hidden_size:
        # (a draft whose config states the widths differ: eyas.formats.validate, with its tensors)
        out.append(
            finding(
                "target_embeddings_unshareable",
                "embed_tokens.weight",
                f"draft hidden {c.hidden_size} != target hidden {H} and the draft has no embed_tokens: nothing "
                "can be shared",
                "export the draft's own embed_tokens",
            )
        )
    if N is not None:
        out += capture_layer_problems(c, N)
    mp = tgt.get("max_position_embeddings")
    if mp is not None and c.max_position_embeddings < mp:
        out.append(
            finding(
                "target_context_longer",
                "max_position_embeddings",
                f"draft max_position_embeddings {c.max_position_embeddings} < the target's {mp}: "
                "engines size the draft's rope cache by it and fail or degrade on longer contexts",
                f"set max_position_embeddings to {mp} (rope extrapolates; acceptance past the training length "
                "may drop)",
            )
        )
    archs = tgt.get("architectures")
    if archs and c.verifier.architectures and set(archs) != set(c.verifier.architectures):
        out.append(
            finding(
                "target_architectures",
                "verifier.architectures",
                f"the draft was made for {list(c.verifier.architectures)}, the target is {list(archs)}",
                "use a draft made for this target, or fix speculators_config.verifier",
            )
        )
    return out


def contract_problems(ckpt: Checkpoint) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Target-independent findings: verifier portability and embeddings no target can lend (problems), rope (a
    warning)."""
    c, problems, warnings = ckpt.contract, [], []
    name = c.verifier.name_or_path
    spec_files = [f for f, fmt in ckpt.files.items() if fmt == "speculators"]
    if spec_files and not name:
        problems.append(
            finding(
                "verifier_name_missing",
                "speculators_config.verifier.name_or_path",
                f"{spec_files[0]}: no verifier name: a reader that serves or loads the verifier a draft names "
                "cannot find the target (see consumers)",
                _HUB_ID,
            )
        )
    elif name and not _PORTABLE.match(name):
        problems.append(
            finding(
                "verifier_not_portable",
                "speculators_config.verifier.name_or_path",
                f"verifier {name!r} is a local path: the checkpoint is not portable "
                "(readers that serve or download the verifier a draft names look for it there; see consumers)",
                _HUB_ID,
            )
        )
    if c.rope_theta is None:
        warnings.append(
            finding(
                "rope_theta_absent",
                "rope_theta",
                "the config names no rope_theta: every engine builds theta 10000 (right for drafts trained so, as "
                "the original EAGLE-3 drafts were; wrong if the draft was trained with the target's rope)",
                "write the rope_theta the draft was trained with",
            )
        )
    return problems, warnings
