"""Linear layers for decoding in the layout this CPU multiplies fastest: oneDNN's packed weights.

Decoding at batch 1 multiplies a handful of rows by every weight matrix, once per step. PyTorch's
plain kernels do that far below the memory bandwidth on CPUs (in bf16 most of all); oneDNN's
packed layout, the one torch.compile's CPU "freezing" uses, runs the same products at about twice
the speed, with the same results in bf16 and rounding-level differences in fp32. A packed weight is
a copy made once. Where oneDNN cannot pack bf16 (AVX2-only CPUs) the product runs on eyas's own
kernel (eyas.decode.bf16_kernel), elsewhere where it cannot pack (another device or dtype) on F.linear.

    PackedLinear    one product for one or several linears that read the same input (q/k/v, gate/up)
    packed_linears  a context in which a module's nn.Linear layers run packed (the drafter's decode steps)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eyas.decode import bf16_kernel


def pack(weight: Tensor) -> Tensor | None:
    """oneDNN's packed copy of a [out, in] weight, or None where oneDNN cannot pack it."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
    except RuntimeError:  # e.g. bf16 on a CPU without the instructions oneDNN needs for it
        return None


class PackedLinear:
    """x @ W^T (+ b) (+ a residual) for one or more linears reading the same input, as ONE product."""

    def __init__(self, linears: Sequence[nn.Linear]):
        with torch.no_grad():
            weight = torch.cat([m.weight for m in linears]) if len(linears) > 1 else linears[0].weight.detach()
            biases = [m.bias for m in linears]
            self.bias = None if biases[0] is None else torch.cat(biases).detach()
            self.packed = pack(weight)
        self.weight = weight if self.packed is None else None
        self.native = self.packed is None and bf16_kernel.usable(weight)

    def __call__(self, x: Tensor, add: Tensor | None = None) -> Tensor:
        """x [..., in] -> [..., out]; `add` (the output's shape) is summed into the result."""
        if self.native:  # summed in fp32 with the bias, rounded once to x's dtype, as torch's bf16 linear
            y = bf16_kernel.matmul(x, self.weight)
            y = (y if self.bias is None else y + self.bias).to(x.dtype)
            return y if add is None else add + y
        if self.packed is None:
            y = F.linear(x, self.weight, self.bias)
            return y if add is None else add + y
        x = x.contiguous()
        if add is None or self.bias is not None:
            y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
            return y if add is None else add + y
        return torch.ops.mkldnn._linear_pointwise.binary(x, add, self.packed, None, "add")


class _PackedModule(nn.Module):
    """An nn.Linear's stand-in inside `packed_linears`; `weight` / `bias` stay readable (dtype, device)."""

    def __init__(self, original: nn.Linear, packed: PackedLinear):
        super().__init__()
        self.packed = packed
        self.__dict__["original"] = original  # not a submodule: the layer is only lent

    @property
    def weight(self) -> Tensor:
        return self.__dict__["original"].weight

    @property
    def bias(self) -> Tensor | None:
        return self.__dict__["original"].bias

    def forward(self, x: Tensor) -> Tensor:
        return self.packed(x)


# Packed copies by layer, valid while the weight is the same tensor, unmodified (`_version`).
_PACKED: weakref.WeakKeyDictionary[nn.Linear, tuple[tuple, PackedLinear]] = weakref.WeakKeyDictionary()


def _stamp(linear: nn.Linear) -> tuple:
    w = linear.weight
    return w.data_ptr(), w._version, w.dtype, None if linear.bias is None else linear.bias._version


def _packed(linear: nn.Linear) -> PackedLinear:
    known = _PACKED.get(linear)
    if known is None or known[0] != _stamp(linear):
        known = _PACKED[linear] = (_stamp(linear), PackedLinear([linear]))
    return known[1]


def is_packed(module: nn.Module) -> bool:
    """Whether every nn.Linear of `module` has its packed copy already (`packed_linears` makes none)."""
    return all(m in _PACKED and _PACKED[m][0] == _stamp(m) for m in module.modules() if _plain(m))


def _plain(m: nn.Module) -> bool:
    """An nn.Linear that computes x @ W.T + b: a subclass with its own forward (Llama 4's router returns
    scores and logits) is not one, and packing it would replace what it computes."""
    return isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward


@contextmanager
def packed_linears(module: nn.Module) -> Iterator[None]:
    """Inside: every nn.Linear of `module` runs packed (no gradients; inference only). The layers
    are put back on exit; the packed copies are kept for the next call until a weight changes."""
    swapped = [(parent, name, child) for parent in module.modules()
               for name, child in parent.named_children() if _plain(child)]
    try:
        for parent, name, child in swapped:
            setattr(parent, name, _PackedModule(child, _packed(child)))
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
