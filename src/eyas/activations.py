"""The MLP activations the drafter implements, under the names configs give them (transformers'
ACT2FN keys). Its own module so that config reading (eyas.formats) can name a draft whose
`hidden_act` eyas cannot run without importing the model."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}
