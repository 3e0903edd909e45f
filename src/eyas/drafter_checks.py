"""Whether given data can make a Drafter: checked before any tensor is copied into one.

A draft reaches the model from a checkpoint, from training, or from a test; whichever way, a wrong
shape or an inconsistent vocab map must stop it with a ContractError that names what was found and
what the contract expected, never run silently into wrong tokens. The vocab-map rule is not written
here: it is `eyas.formats.vocab_map_problems`, the same rule `eyas check` applies to a checkpoint.
"""

from __future__ import annotations

from torch import Tensor

from eyas.contract import DraftContract, expected_shapes
from eyas.errors import ContractError
from eyas.formats import vocab_map_problems


def check_runnable(c: DraftContract) -> None:
    """The draft is made of parts eyas implements. A draft with a mixture-of-experts MLP, latent attention
    or another part eyas has no code for is read and checked (inspect, check, convert) but never run:
    every verb that runs a draft passes here (through Drafter.from_tensors), so each refuses it the same way,
    in one line naming the part, instead of building a Llama layer that would silently compute something else."""
    if c.unsupported:
        raise ContractError(
            f"eyas cannot run this draft: it has a {c.unsupported}",
            "eyas inspect and eyas check read it; run it in an engine that implements this layer",
        )


def check_buildable(c: DraftContract, embed_tokens: Tensor | None, lm_head: Tensor | None = None) -> None:
    """The contract can make a drafter with these (borrowed) embeddings and lm_head: a reduced vocab
    comes with its map, and the draft has exactly one embedding table and one lm_head of the target's
    shape."""
    if c.reduced_vocab and not c.has_vocab_map:
        raise ContractError(
            f"the draft predicts {c.draft_vocab_size} of the target's {c.vocab_size} tokens "
            "but has no d2t/t2d",
            "add the vocab map the draft was trained with (d2t, t2d) to the checkpoint",
        )
    _borrowed("embed_tokens", c.has_embeddings, embed_tokens, (c.vocab_size, c.hidden_size), "the target's embeddings")
    _borrowed("lm_head", c.has_lm_head, lm_head, (c.vocab_size, c.hidden_size), "the target's lm_head")


def _borrowed(name: str, own: bool, given: Tensor | None, shape: tuple[int, int], what: str) -> None:
    """A tensor the draft either ships (`own`: none may be given) or borrows from the target (given, and
    of the target's [vocab_size, hidden_size] shape)."""
    if own and given is not None:
        raise ValueError(f"the contract has its own {name}; do not pass the target's as well")
    if own:
        return
    if given is None:
        raise ContractError(f"the draft has no {name}.weight and none was given",
                            f"pass {what}: {name}=eyas.target.target_tensors(...)")
    if tuple(given.shape) != shape:
        raise ContractError(f"the shared {name} is {list(given.shape)}; the draft expects [vocab_size, hidden_size] "
                            f"= {list(shape)}", f"use {what}, of the target the draft was trained for")


def _check_shapes(expected: dict[str, tuple[int, ...]], tensors: dict[str, Tensor]) -> None:
    """Every tensor named in `expected` has its shape (the names are all there: checked before)."""
    wrong = [f"{k} is {list(tensors[k].shape)}, expected {list(s)}" for k, s in expected.items()
             if tuple(tensors[k].shape) != s]
    if wrong:
        raise ContractError(
            "; ".join(wrong), "the config and the weights disagree: run eyas check on the checkpoint"
        )


def check_tensors(c: DraftContract, tensors: dict[str, Tensor]) -> None:
    """Exactly the tensors the contract names (canonical names), each of the shape it expects."""
    expected = expected_shapes(c)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ContractError(
            f"draft tensors do not match the contract: missing {missing}, unexpected {unexpected}",
            "read the checkpoint with eyas.formats.read_checkpoint, which derives the contract from it",
        )
    _check_shapes(expected, tensors)


def check_vocab_map(c: DraftContract, d2t: Tensor, t2d: Tensor) -> None:
    """d2t and t2d have the contract's shapes and pass the one vocab-map rule (the first finding raises).

    The rule, `eyas.formats.vocab_map_problems`: d2t int64 offsets whose target ids
    (arange + d2t) rise strictly inside the target vocab, t2d a bool mask marking exactly those ids.
    """
    expected = expected_shapes(c)
    _check_shapes({k: expected[k] for k in ("d2t", "t2d")}, {"d2t": d2t, "t2d": t2d})
    problems = vocab_map_problems(c, {"d2t": d2t.cpu(), "t2d": t2d.cpu()})
    if problems:
        raise ContractError(problems[0]["problem"], problems[0]["fix"])

