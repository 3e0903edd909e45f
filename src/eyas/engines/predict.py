"""eyas's prediction of what an engine accepts, on the token sequences the engine itself generated.

An engine that drafts k tokens greedily works like this: after the target's pass has fixed token
x_n, the draft reads the target's features at n-1 and x_n (chain start t = n-1 in eyas's alignment,
`eyas.shift`) and proposes x_{n+1} .. x_{n+k}; the target accepts the longest prefix equal to its own
greedy tokens, adds one token of its own, and the next chain starts after it. vLLM counts each such
step as one draft (`vllm:spec_decode_num_drafts`) and position i as accepted when the first i+1
drafted tokens were (`..._num_accepted_tokens_per_pos`).

`predict` replays exactly that walk with eyas's own draft and target on the engine's sequences: the
truth at every position is the ENGINE's token (what its verifier accepted), the draft's tokens are
eyas's teacher-forced unroll (`eyas.evaluate.sample_predictions`, exact for every accepted prefix).
The walk's last step may draft past the engine's last token (the engine verified those tokens, then
cut its output at max_tokens), so each sequence is extended by k+1 greedy tokens of eyas's target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from eyas.decode.sampling import scaled
from eyas.evaluate import sample_predictions, target_greedy
from eyas.target_head import refuse_head_bias


@dataclass
class Prediction:
    """Counts in the engine's definition, plus what is needed to pair them with the engine's drafts."""

    drafts: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    tokens_compared: int = 0  # engine tokens checked against eyas's greedy target
    token_mismatches: int = 0  # engine tokens eyas's target would not have chosen (fp32 rounding near ties)
    chains: list[Tensor | None] = field(default_factory=list)  # per sequence: [T-2, k] eyas's draft tokens by
    truths: list[Tensor | None] = field(default_factory=list)  # chain start, and the engine's tokens there
    per_sequence: list[tuple[int, list[int]]] = field(default_factory=list)  # (drafts, accepted by position)


def _extend(target, seq: list[int], n: int) -> list[int]:
    """`seq` plus the target's next `n` greedy tokens (past the engine's output: see the module doc)."""
    ids = torch.tensor([seq], device=target.model.device)
    out = target.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0].tolist()


def _walk(chain: Tensor, truth: Tensor, start: int, new_tokens: int, k: int, counts: list[int]) -> int:
    """Replay the engine's steps from chain start `start` until it has produced `new_tokens`; add each
    step's accepted positions to `counts`; return the number of steps (drafts)."""
    made, t, drafts = 1, start, 0  # the prefill made the first token
    while made < new_tokens:
        hit = (chain[t, :k] == truth[t, :k]).int()
        accepted = int(torch.cummin(hit, 0).values.sum())  # the longest matching prefix
        for i in range(accepted):
            counts[i] += 1
        drafts += 1
        made += accepted + 1  # the accepted tokens and the target's own
        t += accepted + 1
    return drafts


@torch.inference_mode()
def predict(drafter, target, layers: list[int], prompts: list[list[int]], outputs: list[list[int]], k: int
            ) -> Prediction:
    """eyas's acceptance for `drafter` (a Drafter) fed the target's states at `layers`, on the engine's
    `outputs` to `prompts` (token ids). The target runs where it was loaded; the draft and the
    comparison run on the CPU."""
    refuse_head_bias(target.model.get_output_embeddings().bias is not None, f"target {target.path}")
    lm_head = target.model.get_output_embeddings().weight.float().cpu()  # [V, H]
    pred = Prediction(accepted_by_position=[0] * k)
    for prompt, out in zip(prompts, outputs):
        if not out:
            pred.chains.append(None)
            pred.truths.append(None)
            pred.per_sequence.append((0, [0] * k))
            continue
        seq = _extend(target, prompt + out, k + 1)
        ids = torch.tensor(seq)
        T = len(seq)
        cap = target.forward(ids[None].to(target.model.device), layers, with_logits=False)
        sample = {"input_ids": ids, "loss_mask": torch.ones(T, dtype=torch.bool),
                  "features": cap.features[0].float().cpu(), "last_hidden": cap.last_hidden[0].float().cpu()}
        engine_next = torch.cat([ids[1:], ids[-1:]])  # y_s = the token the engine put after x_s
        p = sample_predictions(drafter, sample, lm_head, k, 1, greedy=engine_next)  # rows = chain starts 0..T-3
        pred.chains.append(p["pred"])
        pred.truths.append(p["truth"])
        counts = [0] * k
        drafts = _walk(p["pred"], p["truth"], len(prompt) - 1, len(out), k, counts)
        pred.per_sequence.append((drafts, counts))
        pred.drafts += drafts
        pred.accepted_by_position = [a + c for a, c in zip(pred.accepted_by_position, counts)]
        mine = target_greedy(sample, lm_head)[len(prompt) - 1: len(prompt) + len(out) - 1]  # eyas's choice of out
        pred.tokens_compared += len(out)
        pred.token_mismatches += int((mine != ids[len(prompt): len(prompt) + len(out)]).sum())
    return pred


def compare_drafts(pred: Prediction, engine_drafts: list[list], prompts: list[list[int]], k: int) -> dict:
    """The engine's own drafts against eyas's at the same chain starts: the share whose first token is
    the same, and whose accepted length is the same. With the same wiring both are near 1 (fp32 on
    both sides); a different wiring changes the draft's tokens even where acceptance barely moves."""
    same_first = same_len = n = 0
    for req, start, tokens in engine_drafts:
        chain, truth = pred.chains[req], pred.truths[req]
        if chain is None or start >= chain.shape[0] or len(tokens) < k:
            continue
        mine = chain[start, :k]
        theirs = torch.tensor(tokens[:k])
        acc = [int(torch.cummin((x == truth[start, :k]).int(), 0).values.sum()) for x in (mine, theirs)]
        n += 1
        same_first += int(mine[0] == theirs[0])
        same_len += int(acc[0] == acc[1])
    return {"drafts": n, "first_token_same": same_first / n if n else None,
            "accepted_length_same": same_len / n if n else None}


ROWS = 16  # draft steps run through the target at once (right-padded; causal attention needs no mask)
BLOCK = 128  # output positions whose distributions are held at once (fp32 [BLOCK, V])
RARE = 1e-7  # a token the target gives less than this is one a faithful sampler almost never draws


@dataclass
class SampledPrediction:
    """What a faithful engine sampling at temperature T would accept on the engine's own draft steps,
    and how the engine's output tokens sit in the target's distribution.

    per_sequence: (drafts, expected accepted by position) per request; chances: per position, every
    step's chance q of accepting that far (the served count is a sum of trials with these chances).
    surprisal / entropy / surprisal_var: sums over the output tokens of -log p(x), the target's
    entropy at that position, and the variance of -log p under p; rare: output tokens with p < RARE."""

    per_sequence: list[tuple[int, list[float]]] = field(default_factory=list)
    chances: list[list[float]] = field(default_factory=list)
    tokens: int = 0
    surprisal: float = 0.0
    entropy: float = 0.0
    surprisal_var: float = 0.0
    rare: int = 0


def _last_hidden(target, rows: list[list[int]]) -> Tensor:
    """The target's final-normed states [len(rows), longest, H] over the rows (one forward)."""
    ids = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return target.forward(ids.to(target.model.device), [], with_logits=False).last_hidden


def _log_probs(target, states: Tensor, temperature: float) -> Tensor:
    """log_softmax(target logits / T) [n, V] in fp32 on the CPU, from final-normed states [n, H] (the logits
    mapped as the target's class maps lm_head's output: eyas.logit_map)."""
    logits = target.logit_map(target.model.get_output_embeddings()(states).float().cpu())
    return torch.log_softmax(scaled(logits, temperature), -1)


def _output_stats(pred: SampledPrediction, target, seq: list[int], prompt_len: int, temperature: float) -> None:
    """Add the output tokens' surprisal, the target's entropy there and its variance, and rare tokens:
    one forward over the sequence, the [n, V] distributions BLOCK positions at a time."""
    positions = list(range(prompt_len - 1, len(seq) - 1))
    last = _last_hidden(target, [seq[:-1]])[0]
    for first in range(0, len(positions), BLOCK):
        at = positions[first: first + BLOCK]
        logp = _log_probs(target, last[at], temperature)  # [n, V]
        p = logp.exp()
        x = torch.tensor(seq[at[0] + 1: at[-1] + 2])
        s = -logp[torch.arange(len(at)), x]
        h = -(p * logp).sum(-1)
        pred.tokens += len(at)
        pred.surprisal += float(s.sum())
        pred.entropy += float(h.sum())
        pred.surprisal_var += float(((p * logp.square()).sum(-1) - h.square()).clamp_min(0).sum())
        pred.rare += int((s > -math.log(RARE)).sum())


@torch.inference_mode()
def predict_sampled(target, prompts: list[list[int]], outputs: list[list[int]],
                    steps: list[list[tuple[int, list[int]]]], k: int, temperature: float) -> SampledPrediction:
    """eyas's expectation for an engine that samples at `temperature` and drafts argmax tokens, each
    accepted with the target's probability of it (vLLM's EAGLE proposer and rejection sampler without
    draft probabilities, as read from vLLM 0.32's `v1/sample/rejection_sampler.py`): along each step
    the engine took (`steps[r]`: (chain start, its k draft tokens) per counted step of request r),
    position i is accepted with probability q_i = p(d_1) ... p(d_i), each p the target's at
    temperature T after the tokens before it. Every step's k drafts are scored on the path they draft
    (the prefix, then d_1 .. d_{k-1}), so no sampling outcome is needed, only the engine's steps."""
    pred = SampledPrediction(chances=[[] for _ in range(k)])
    for prompt, out, taken in zip(prompts, outputs, steps):
        seq, expected = prompt + out, [0.0] * k
        for block in range(0, len(taken), ROWS):
            chunk = taken[block: block + ROWS]
            rows = [seq[: s + 2] + d[: k - 1] for s, d in chunk]
            last = _last_hidden(target, rows)
            for i, (s, d) in enumerate(chunk):
                logp = _log_probs(target, last[i, s + 1: s + 1 + k], temperature)  # [k, V]
                q = torch.cumsum(logp[torch.arange(k), torch.tensor(d[:k])].double(), 0).exp().tolist()
                expected = [e + x for e, x in zip(expected, q)]
                for depth, x in enumerate(q):
                    pred.chances[depth].append(x)
        pred.per_sequence.append((len(taken), expected))
    return output_fit(target, prompts, outputs, temperature, pred)


@torch.inference_mode()
def output_fit(target, prompts: list[list[int]], outputs: list[list[int]], temperature: float,
               pred: SampledPrediction | None = None) -> SampledPrediction:
    """`pred` (or a new one) with the output tokens' fit to the target's distribution at `temperature`
    added: what `eyas.engines.compare.samples_test` judges, for any engine run, speculative or not."""
    pred = pred or SampledPrediction()
    for prompt, out in zip(prompts, outputs):
        if out:
            _output_stats(pred, target, prompt + out, len(prompt), temperature)
    return pred
