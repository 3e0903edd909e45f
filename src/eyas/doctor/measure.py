"""The measuring harness: one draft, the target's recorded states, and an outcome per wiring.

`Measurer.measure(wiring)` builds (and caches) the drafter the wiring needs, feeds it the features
the wiring describes, and scores greedy chains of DEPTH draft tokens against the target's own
greedy tokens, position by position (`eyas.evaluate`), so every wiring is measured on the same
positions and any two can be compared with `eyas.doctor.stats.paired_test`.
"""

from __future__ import annotations

import math

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

from eyas.acceptance import accepted_chains, chain_acceptance
from eyas.borrowed import borrowed
from eyas.contract import DraftContract, expected_shapes
from eyas.doctor.capture import Capture
from eyas.doctor.stats import DEPTH, FLOOR, Outcome, rejected
from eyas.doctor.wiring import Wiring, stored_ids
from eyas.drafter import Drafter
from eyas.errors import ContractError, EyasError
from eyas.evaluate import sample_predictions, target_greedy
from eyas.formats import Checkpoint, target_facts
from eyas.sampled import first_answer_row
from eyas.target_head import TargetNorm, refuse_head_bias

# Bytes of target log-probability tables kept between wirings (`Measurer._target_log_probs`). One
# table is [answer rows, draft vocab] fp32: 2,000 rows of a dump over a 128k vocabulary are 1 GB,
# and the doctor may hold one per vocab map it tries. Past the budget the oldest go and are
# recomputed when asked again (one matrix product each).
LOG_P_BYTES = 1 << 29


class SkipFcDrafter(Drafter):
    """A drafter fed one H-wide state with fc skipped: what SGLang does when an EAGLE-3 draft is run
    under --speculative-algorithm EAGLE (sglang #21272)."""

    def combine(self, features: Tensor) -> Tensor:
        return features


class Measurer:
    """The draft, the target's states and a cache of outcomes per wiring."""

    def __init__(self, ckpt: Checkpoint, cap: Capture):
        self.ckpt, self.cap, self.contract = ckpt, cap, ckpt.contract
        tgt = cap.target
        self.N, self.H = tgt.num_layers, tgt.hidden_size
        refuse_head_bias(tgt.model.get_output_embeddings().bias is not None, f"target {tgt.path}")
        self.lm_head = tgt.model.get_output_embeddings().weight.detach().float()  # [V, H]
        self.logit_map = tgt.logit_map  # what the target's class does to lm_head's output (eyas.logit_map)
        self.embed = tgt.model.get_input_embeddings().weight.detach().float()  # [V, H]
        decoder, types, text = tgt.decoder, {tgt.model.config.model_type, tgt.config.model_type}, tgt.config.to_dict()

        def norm(module: torch.nn.Module | None) -> TargetNorm | None:  # as the family computes it: Gemma's 1 + w
            if module is None:
                return None
            weight, bias = (getattr(module, name, None) for name in ("weight", "bias"))
            if weight is None:  # OLMo's, nanochat's
                return TargetNorm.unweighted(self.H, types, text, self.lm_head.device)
            return TargetNorm.of(weight.detach().float(), types, text, None if bias is None else bias.detach().float())

        self.final_norm = norm(decoder.norm)
        # None where a layer has no input norm (OLMo 2 normalises after attention and MLP)
        self.input_norms = [norm(getattr(layer, "input_layernorm", None)) for layer in decoder.layers]
        self.target_theta = target_facts(tgt.config.to_dict())["rope_theta"]
        self._greedy: list[Tensor] | None = None  # see `greedy`
        self._recovered: Tensor | None | bool = False  # False: not computed yet
        self._drafters: dict[tuple, Drafter] = {}
        self._outcomes: dict[Wiring, Outcome] = {}
        self._log_p: OrderedDict[tuple, tuple[Tensor, Tensor]] = OrderedDict()  # see `_target_log_probs`

    # -- the draft side --
    def drafter(self, w: Wiring, cls: type[Drafter] = Drafter) -> Drafter:
        key = (cls, *w.drafter_key())
        if key not in self._drafters:
            c, t = self._tensors(w)
            self._drafters[key] = cls.from_tensors(c, t, **borrowed(c, embed_tokens=self.embed, lm_head=self.lm_head))
        return self._drafters[key]

    def _tensors(self, w: Wiring) -> tuple[DraftContract, dict[str, Tensor]]:
        """The contract and tensors that run wiring `w`: tensors the wiring does not use are dropped
        (as engines skip them), a norm it turns on without trained weights gets weight 1, and the vocab
        map is the stored, identity or recovered one."""
        c = self.contract.replace(norm_before_residual=w.norm_before_residual, norm_before_fc=w.norm_before_fc,
                                  fc_norm=w.fc_norm, norm_output=w.norm_output, rope_theta=w.rope_theta,
                                  rope_scaling=self.contract.rope_scaling if w.rope_scaled else None,
                                  has_embeddings=w.embeddings == "own", has_vocab_map=w.vocab != "none")
        src, out = self.ckpt.tensors, {}
        for name, shape in expected_shapes(c).items():
            if name in ("d2t", "t2d"):
                continue
            if name in src and tuple(src[name].shape) == shape:
                out[name] = src[name]
            elif name == "input_norm.weight" or name.startswith("fc_norm."):
                out[name] = torch.ones(shape)
            else:
                raise ContractError(f"{name} is missing or misshapen; the draft cannot run", "run eyas check on it")
        if c.has_vocab_map:
            out.update(self._vocab_map(w.vocab, c))
        return c, out

    def _vocab_map(self, which: str, c: DraftContract) -> dict[str, Tensor]:
        """d2t and t2d for the stored, identity or recovered map of draft ids to target ids."""
        Vd = c.draft_vocab_size
        ids = {"stored": lambda: stored_ids(self.ckpt.tensors, self.contract), "identity": lambda: torch.arange(Vd),
               "recovered": self.recovered}[which]()  # target id of each draft id
        return {"d2t": (ids - torch.arange(Vd)).long(),
                "t2d": torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, ids, True)}

    # -- the feature side --
    def features(self, s: dict[str, Tensor], w: Wiring) -> Tensor:
        """[T, A*H] for wiring `w` out of the sample's recorded states: a slice, permutation, norm, shift."""
        T = s["states"].shape[0]
        at = (torch.arange(T) + w.shift).clamp(0, T - 1)  # position t reads the states of t + shift
        chunks = [s["states"][at, k] for k in w.layers]  # A x [T, H]
        if w.normed == "all":
            chunks = [self.final_norm(x) for x in chunks]
        elif w.normed == "last":
            i = w.layers.index(max(w.layers))
            chunks[i] = self.final_norm(chunks[i])
        return torch.cat(chunks, dim=-1)

    # -- scoring --
    def measure(self, w: Wiring) -> Outcome:
        """The outcome of wiring `w` on the recorded positions (cached: each wiring runs once)."""
        if w not in self._outcomes:
            self._outcomes[w] = self._measure(w)
        return self._outcomes[w]

    def _measure(self, w: Wiring) -> Outcome:
        bad = [k for k in w.layers if not 0 <= k <= self.N]
        if bad:
            return rejected(self.cap.sample_positions, f"layers {bad} do not exist in a {self.N}-layer target")
        try:
            drafter = self.drafter(w)
        except ContractError as e:  # e.g. a malformed stored d2t: engines would fail or misread it
            return rejected(self.cap.sample_positions, str(e))
        samples = [{**s, "features": self.features(s, w)} for s in self.cap.samples]
        return self.run(drafter, samples, self.greedy)

    @property
    def greedy(self) -> list[Tensor]:
        """The target's greedy tokens per captured sample: they do not depend on the wiring, so the
        full-vocab matmul runs once, not once per hypothesis."""
        if self._greedy is None:
            self._greedy = [target_greedy(s, self.lm_head) for s in self.cap.samples]
        return self._greedy

    def run(self, drafter: Drafter, samples: list[dict[str, Tensor]], greedy_tokens: list[Tensor]) -> Outcome:
        """Greedy chains of DEPTH draft tokens at every measured position of `samples`, and the
        continuous measures along them (`continuous`)."""
        parts, sizes, vocab = [], [], self._vocab(drafter)
        with torch.inference_mode():
            for s, greedy in zip(samples, greedy_tokens, strict=True):
                sizes.append(0)
                if int(s["loss_mask"].sum()) >= 2:
                    measure = self.continuous(s, greedy, vocab)
                    p = sample_predictions(drafter, s, self.lm_head, DEPTH, 1, greedy=greedy, measure=measure)
                    valid = p["valid"].double()  # each measure averaged over the depths whose target token is known
                    mean = ((p.pop("measured") * valid[..., None]).sum(1) / valid.sum(1)[:, None]).float()  # [N, 3]
                    parts.append(p | {"logprob": mean[:, 0], "kl": mean[:, 1], "uniform": mean[:, 2]})
                    sizes[-1] = len(mean)
        if not parts:
            raise EyasError("no positions to measure", "use prompts that the target answers (or a longer dump)")
        pred, truth, valid, ended, logprob, kl, uniform = (
            torch.cat([p[k] for p in parts]) for k in ("pred", "truth", "valid", "ended", "logprob", "kl", "uniform"))
        rep = chain_acceptance(pred, truth, valid, ended)
        accepted = accepted_chains(pred, truth, valid).sum(1)  # [P]
        return Outcome(pred[:, 0] == truth[:, 0], accepted, logprob, kl, rep["acceptance_by_depth"],
                       rep["tau_chain"][str(DEPTH)], samples=tuple(sizes), vocabulary=vocab[2],
                       uniform_logprob=float(uniform.double().mean()))

    def _vocab(self, drafter: Drafter) -> tuple[Tensor, Tensor, tuple]:
        """The draft vocabulary as target ids, the draft id of every target id (-1: not drafted), and a
        key naming that vocabulary (for `_target_log_probs`'s cache). Once per run, not per sample."""
        ids = drafter.to_target_ids(torch.arange(drafter.lm_head.out_features))
        draft_id = torch.full((self.lm_head.shape[0],), -1, dtype=torch.long)
        draft_id.index_copy_(0, ids, torch.arange(len(ids)))
        return ids, draft_id, (len(ids), hash(ids.numpy().tobytes()))

    def continuous(self, sample: dict[str, Tensor], greedy: Tensor,
                   vocab: tuple[Tensor, Tensor, tuple]) -> Callable[[Tensor, Tensor], Tensor]:
        """The `measure` `sample_predictions` applies at each depth (its logits [N, Vd] and rows
        [N]): [N, 3], the draft's log-probability of the target's token there (FLOOR when the
        draft vocabulary lacks it), KL(target || draft) over the draft vocabulary (the target's
        distribution renormalised there), and the log-probability a uniform guess over the draft
        vocabulary gives the target's token (the same FLOOR). `greedy`: the sample's target tokens;
        `vocab`: `_vocab(drafter)`."""
        ids, draft_id, key = vocab
        first = first_answer_row(sample)
        table = self._target_log_probs(sample, ids, key, first)  # [T - first, Vd]

        def measure(logits: Tensor, rows: Tensor) -> Tensor:
            log_q = logits.float().log_softmax(-1)  # [N, Vd]
            d = draft_id[greedy[rows]]  # [N]; -1: the target's token is not in the draft vocabulary
            logprob = log_q.gather(-1, d.clamp(min=0)[:, None])[:, 0].masked_fill(d < 0, FLOOR).clamp(min=FLOOR)
            log_p = table[rows - first]  # [N, Vd]
            uniform = torch.full_like(logprob, -math.log(len(ids))).masked_fill(d < 0, FLOOR)
            return torch.stack([logprob, (log_p.exp() * (log_p - log_q)).sum(-1), uniform], dim=-1)

        return measure

    def _target_log_probs(self, sample: dict[str, Tensor], ids: Tensor, vocab_key: tuple, first: int) -> Tensor:
        """The target's next-token log-probabilities over the draft vocabulary `ids` at the rows of
        `sample` from `first` on, from its final-normed states: [T - first, Vd]. Cached per sample and
        vocabulary: every hypothesis with the same vocab map reuses one product."""
        states = sample["last_hidden"]
        key = (id(states), first, *vocab_key)
        if key in self._log_p and self._log_p[key][0] is states:  # the id of a freed tensor is reused
            self._log_p.move_to_end(key)
            return self._log_p[key][1]
        table = self.logit_map(states[first:].float() @ self.lm_head[ids].T).log_softmax(-1)  # [T - first, Vd]
        self._log_p.pop(key, None)
        self._log_p[key] = states, table
        held = sum(t.nbytes for _, t in self._log_p.values())
        while held > LOG_P_BYTES and len(self._log_p) > 1:  # the newest stays: it is about to be used
            held -= self._log_p.popitem(last=False)[1][1].nbytes
        return table

    def recovered(self) -> Tensor | None:
        """The vocab map read off lm_head (`recover_vocab_map`), computed once, when first asked for."""
        if self._recovered is False:
            self._recovered = recover_vocab_map(self.ckpt.tensors.get("lm_head.weight"), self.lm_head, self.contract)
        return self._recovered

    def map_disagrees(self, ids: Tensor) -> bool:
        """Whether lm_head's rows point elsewhere than `ids` says, judged on 256 rows (a full check of
        a 32k draft vocab against a 128k target vocab would cost a full matmul)."""
        rows = torch.linspace(0, len(ids) - 1, min(256, len(ids))).long()
        c = self.contract.replace(draft_vocab_size=len(rows))
        sample = recover_vocab_map(self.ckpt.tensors["lm_head.weight"][rows], self.lm_head, c)
        return sample is None or bool((sample != ids[rows]).float().mean() > 0.1)

def recover_vocab_map(draft_head: Tensor | None, target_head: Tensor, c: DraftContract) -> Tensor | None:
    """Target id of each draft id, read off lm_head: each draft row's most similar target row.

    Drafts trained by eyas, speculators and SpecForge start lm_head as the target's rows of the draft
    vocab, and training moves them little; when every draft row points at a distinct target row with
    cosine > 0.5 the map is taken as recovered. None otherwise (or for a full-vocab draft).
    """
    if draft_head is None or not c.reduced_vocab or draft_head.shape[1] != target_head.shape[1]:
        return None
    a = torch.nn.functional.normalize(draft_head.float(), dim=-1)  # [Vd, H]
    b = torch.nn.functional.normalize(target_head.float(), dim=-1)  # [V, H]
    best = [(a[i:i + 4096] @ b.T).max(-1) for i in range(0, len(a), 4096)]  # in blocks: Vd x V can be large
    cos, ids = torch.cat([m.values for m in best]), torch.cat([m.indices for m in best])
    if ids.unique().numel() != len(ids) or float(cos.min()) <= 0.5:
        return None
    return ids
