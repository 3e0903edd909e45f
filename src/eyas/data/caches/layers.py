"""Which target layers a cache stores, in eyas's convention, and how eyas knows it.

Trainers name layers in one of two conventions (see /work/shared/reference/feature-caches.md §0):
"output of layer k" (SpecForge, ModelOpt, SGLang's API, speculators' legacy generator) stores the
residual stream eyas calls capture index k+1; "input of layer k" (vLLM, speculators today) stores
capture index k itself. Most caches do not record their layers at all, so the answer is one of:
recorded in the cache, given by the caller (e.g. read from the draft's config the way that trainer
reads it), assumed from the trainer's default for the target's depth, or unknown. The note says
which, in the words the doctor prints: "stored: output of layers 1, 29, 57 = capture [2, 30, 58]".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eyas.errors import FormatError


@dataclass(frozen=True)
class Convention:
    """How one trainer names and chooses the layers it stores."""

    trainer: str  # "SpecForge"
    output_of_layer: bool  # ids name the OUTPUT of layer k (= capture k+1); False: the input (= capture k)
    default: Callable[[int], Sequence[int]]  # the trainer's default ids, in its own convention, for N layers
    default_text: str  # the default as a formula: "[1, N//2-1, N-4]"
    chosen_by: str  # how a run picks its layers: "it takes them from the draft config's ..., else this default"

    @property
    def owner(self) -> str:
        """The trainer's name as a possessive: "SpecForge's", "speculators'"."""
        return f"{self.trainer}'" if self.trainer.endswith("s") else f"{self.trainer}'s"


@dataclass(frozen=True)
class Layers:
    capture: tuple[int, ...] | None
    recorded: bool
    note: str


def to_capture(conv: Convention, ids: Sequence[int]) -> tuple[int, ...]:
    """A trainer's layer ids in eyas's capture convention."""
    return tuple(int(k) + 1 if conv.output_of_layer else int(k) for k in ids)


def stored_text(conv: Convention, capture: Sequence[int]) -> str:
    """'stored: output of layers 1, 29, 57 = capture [2, 30, 58]' (or 'input of layers ...')."""
    if conv.output_of_layer:
        names = ", ".join("the embeddings" if k == 0 else str(k - 1) for k in capture)
        return f"stored: output of layers {names} = capture {list(capture)}"
    return f"stored: input of layers {', '.join(map(str, capture))} = capture {list(capture)}"


def resolve_layers(conv: Convention, slots: int, where: object, *, recorded: Sequence[int] | None = None,
                   recorded_in: str = "", num_layers: int | None = None,
                   layer_ids: Sequence[int] | None = None) -> Layers:
    """The capture layers of a cache holding `slots` layers per position, and the note saying why.

    Precedence: what the cache records (in the trainer's convention), then the caller's `layer_ids`
    (eyas's convention), then the trainer's default for a `num_layers`-deep target, else unknown.
    """
    if recorded is not None:
        capture = to_capture(conv, recorded)
        _check_count(capture, slots, where, "records")
        return Layers(capture, True, f"{stored_text(conv, capture)} (recorded in {recorded_in})")
    not_recorded = f"{conv.trainer} does not record its layers"
    if layer_ids is not None:
        capture = tuple(int(k) for k in layer_ids)
        _check_count(capture, slots, where, "the layer ids given")
        return Layers(capture, False, f"{stored_text(conv, capture)} (as given; {not_recorded})")
    if num_layers is None:
        return Layers(None, False, f"unknown: {not_recorded} and the target's depth was not given; "
                                   f"{conv.owner} default is ids {conv.default_text} for an N-layer target")
    capture = to_capture(conv, conv.default(num_layers))
    if len(capture) != slots:
        return Layers(None, False, f"unknown: the cache stores {slots} layers per position, {conv.owner} "
                                   f"default {conv.default_text} is {len(capture)}; {not_recorded}: eval reads its "
                                   "slots as the draft's capture layers, the doctor with the full target names the "
                                   "layers they hold (the library's open_cache takes layer_ids)")
    return Layers(capture, False, f"{stored_text(conv, capture)} (assumed: {conv.owner} default for a "
                                  f"{num_layers}-layer target; {not_recorded}: {conv.chosen_by})")


def _check_count(capture: Sequence[int], slots: int, where: object, source: str) -> None:
    if len(capture) != slots:
        raise FormatError(f"{where}: {source} {len(capture)} layers {list(capture)}, but its samples store "
                          f"{slots} per position", "give as many layer ids as the cache stores layers")
