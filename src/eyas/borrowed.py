"""What a draft borrows from its target instead of shipping: the token embeddings, and lm_head for a
full-vocab draft trained on the target's frozen head (engines share the target's with a draft that
has none). Each is a non-persistent buffer: never saved with the draft (its checkpoint has no such
tensor), never trained (not a parameter), handed in by whoever builds the drafter from the target.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from eyas.contract import DraftContract

# what a draft may borrow (a Drafter keyword and module name) -> the contract flag saying it ships its own
_OWN = {"embed_tokens": "has_embeddings", "lm_head": "has_lm_head"}


def borrowed_names(c: DraftContract) -> list[str]:
    """The target matrices a draft of contract `c` reads instead of shipping: embed_tokens, lm_head."""
    return [name for name, own in _OWN.items() if not getattr(c, own)]


def borrowed(c: DraftContract, **target: Tensor) -> dict[str, Tensor]:
    """Of the target's matrices given by name, those `c` borrows: the keywords `Drafter.from_tensors` takes."""
    return {name: target[name] for name in borrowed_names(c)}


class SharedEmbedding(nn.Module):
    """The target's `embed_tokens` [V, H], borrowed."""

    def __init__(self, weight: Tensor):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)


class SharedHead(nn.Linear):
    """The target's `lm_head` [V, H], borrowed: an nn.Linear, so decoding packs it as it packs the
    draft's own, whose weight is a buffer."""

    def __init__(self, weight: Tensor):
        nn.Module.__init__(self)
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight, persistent=False)
        self.register_parameter("bias", None)
