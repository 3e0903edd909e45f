"""The KV cache of decoding, for the target and the drafter: preallocated once, edited in place.

transformers' DynamicCache and eyas's training-time DraftCache grow by concatenation, so every layer
copies its whole cache on every step, and dropping rejected draft tokens allocates again. Decoding
at batch 1 knows the most positions it can ever need (prompt + new tokens + one round's draft), so
eyas allocates them once (gpt-fast's static cache): a round writes after the valid positions, and
`keep` (target) or `crop` (drafter) makes the verified ones the valid ones.

Keys and values are stored in fp32 whatever the weights' dtype: attention then runs in fp32, which
on CPUs is several times faster than PyTorch's bf16 attention for a handful of queries, and bf16
keys are exact in fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eyas.errors import EyasError


class StaticKV:
    """Keys and values [layers, batch, n_kv, max_len, D]; positions < `length` are valid (every row
    of a batch advances together: a batch of answers is left-padded to one length).

    A drop-in for DraftCache in decoding (`update`, `crop`, `length`, `max_len`): the model's
    forward writes every layer, then advances `length` by the positions it added. `dtype` is fp32
    unless asked (above); a large batch on a GPU may keep the weights' dtype and half the memory.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_len: int, device: torch.device, *,
                 batch: int = 1, dtype: torch.dtype = torch.float32):
        shape = (layers, batch, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def get_seq_length(self) -> int:
        """The positions held (the name transformers' caches use, so the decode loop reads either)."""
        return self.length

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k/v [batch, n_kv, T, D] after the valid positions; return every key and value up to
        them ([batch, n_kv, length + T, D], views in the cache's dtype: nothing is copied)."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise EyasError(f"the KV cache holds {self.max_len} positions; {end} were needed",
                            "allocate the cache for prompt + max_new_tokens + the largest draft")
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def crop(self, length: int) -> None:
        """Forget every position past `length` (e.g. the draft's speculative entries)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def keep(self, n: int, nodes: list[int]) -> None:
        """Keep positions < n, then the entries at n + node for `nodes` (root first, the accepted path
        after it), moved to n, n+1, ...: what a forward over exactly that path would have written.
        A path that is a prefix of the node order needs no move."""
        m = len(nodes)
        if nodes != list(range(m)):
            index = torch.tensor(nodes, device=self.k.device) + n
            self.k[:, :, :, n : n + m] = self.k[:, :, :, index]  # the gather copies before the write
            self.v[:, :, :, n : n + m] = self.v[:, :, :, index]
        self.length = n + m
