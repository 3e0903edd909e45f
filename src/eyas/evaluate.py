"""Offline acceptance: measure a draft standalone against the target's greedy choices.

Alignment (the one used everywhere in eyas, see `eyas.shift.shift_for_draft`): at position t the
draft reads target features g_t (prefix x_0..x_t) and token x_{t+1}; its step j predicts the token
after x_{t+1+j}. The target's greedy choice there is y_{t+1+j} = argmax(logits_{t+1+j}).

Why one teacher-forced unroll is exact for greedy chains: a chain is accepted up to depth j only if
every drafted token before j equalled the target's choice. On self-distilled greedy data the stored
tokens ARE those choices, so along an accepted chain the draft's own inputs equal the teacher-forced
inputs and the free-running draft computes exactly what the teacher-forced unroll computes. Where
the stored token is not the target's greedy choice (prompt text, sampled data) the chain beyond it
is unknown and is not counted (`valid` is False there).
"""

from __future__ import annotations

import itertools
import sys
import tempfile

import torch
from tqdm import tqdm

from eyas.contract import default_capture_layers
from eyas.data import MANIFEST, capture, open_shards, read_prompts
from eyas.drafter_loading import load_drafter_and_config, resolve_drafter
from eyas.errors import ContractError, EyasError
from eyas.shift import label_ids, shift_for_draft
from eyas.target import Target, resolve_target, target_config, target_name, target_tensors


def chain_positions(T: int, depth: int) -> torch.Tensor:
    """[T, depth]: t + 1 + j, the position whose target token depth j of a chain from t predicts
    (>= T past the sample's end)."""
    return torch.arange(T).unsqueeze(1) + 1 + torch.arange(depth).unsqueeze(0)


def chain_truth(input_ids: torch.Tensor, greedy: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ground truth and validity for chains of `depth` draft tokens from every position.

    input_ids: [T] stored tokens x; greedy: [T] y_s = target argmax after x_0..x_s.
    Returns truth [T, depth] with truth[t, j] = y_{t+1+j}, and valid [T, depth]: the position
    exists and the target's answer at depth j is known. Depth 0 is always known (y_{t+1} is
    stored); depth j > 0 continues past the stored x_{t+1+j}, which the accepted draft token
    replaces, so that token must be the target's greedy choice (x_{t+1+j} == y_{t+j}).
    """
    T = input_ids.shape[0]
    idx = chain_positions(T, depth)
    inside = idx < T
    idx_c = idx.clamp(max=T - 1)
    truth = greedy[idx_c]
    # x_s is "on the greedy path" when x_s == y_{s-1}
    on_path = torch.zeros(T, dtype=torch.bool)
    on_path[1:] = input_ids[1:] == greedy[:-1]
    known = on_path[idx_c]
    known[:, 0] = True
    valid = inside & torch.cummin(known.int(), dim=1).values.bool()  # a running AND along depth
    return truth, valid


def chain_acceptance(pred: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor) -> dict:
    """Per-depth conditional acceptance and greedy chain tau from teacher-forced predictions.

    pred/truth/valid: [N, K] (target-vocab ids; N chain starts; K depths). A chain start counts
    for depth j only if it is valid there. accepted[n, j] = all drafted tokens 0..j were right.
    Returns acceptance_by_depth (P(depth j right | depths < j right), depth 1 first), tau_chain
    ({"1": .., "K": ..}: 1 + expected accepted tokens with k drafted, the bonus token included)
    and the counts behind them.

    Every tau_chain[k] is measured over ONE set of chain starts, those valid through depth K: with
    a set per k, the starts near an answer's end (short chains, often accepted) drop out as k grows
    and tau could fall with k, which no decoder does. Over one set, tau is non-decreasing in k.
    """
    K = pred.shape[1]
    correct = (pred == truth) & valid
    accepted = torch.cummin(correct.int(), dim=1).values.bool()  # [N, K]
    # conditional acceptance at depth j: among starts accepted through j-1 and valid at j
    reached = torch.ones_like(accepted)
    reached[:, 1:] = accepted[:, :-1]
    reached &= valid
    by_depth, counts = [], []
    for j in range(K):
        n = int(reached[:, j].sum())
        counts.append(n)
        by_depth.append(float(accepted[:, j][reached[:, j]].float().mean()) if n else float("nan"))
    # tau(k) = 1 + E[accepted tokens among the first k], over the starts valid through depth K
    rows = valid[:, K - 1]
    run = accepted[rows].double().sum(0).cumsum(0)  # [K]: accepted tokens within the first k, summed
    n = int(rows.sum())
    tau = {str(k): float(1 + run[k - 1] / n) if n else float("nan") for k in range(1, K + 1)}
    return {"acceptance_by_depth": by_depth, "depth_counts": counts, "tau_chain": tau}


def tree_tau(topk_ids: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor, depth: int) -> float:
    """Tau of a top-k tree of `depth` levels, measured along the target's greedy path.

    topk_ids: [N, K, k] the draft's k best target-vocab ids at each depth, teacher-forced along the
    true path. The true token survives level j when it is among the k candidates of its parent at
    every level up to j. This is what a full top-k tree of that depth accepts; an EAGLE-2 dynamic
    tree with a smaller node budget accepts at most this (an upper bound for it).
    """
    hit = (topk_ids[:, :depth] == truth[:, :depth, None]).any(-1) & valid[:, :depth]
    accepted = torch.cummin(hit.int(), dim=1).values
    rows = valid[:, depth - 1]
    return float(1 + accepted[rows].sum(1).float().mean()) if rows.any() else float("nan")


def target_greedy(sample: dict, lm_head: torch.Tensor) -> torch.Tensor:
    """y_s = the target's greedy token after x_0..x_s, from the stored final-normed state: [T]."""
    return (sample["last_hidden"].to(lm_head.dtype) @ lm_head.T).argmax(-1)  # [T, H] @ [H, V] -> [T]


def sample_predictions(drafter, sample: dict, lm_head: torch.Tensor, depth: int, top_k: int, *,
                       greedy: torch.Tensor | None = None, logits: bool = False) -> dict:
    """Teacher-forced draft predictions and target ground truth for one unshifted sample.

    Chains start at every position whose given token x_{t+1} and first label x_{t+2} are part of
    the answer (loss_mask), i.e. the states decoding actually visits.
    Returns pred [N, depth], topk [N, depth, top_k] (target-vocab ids), truth/valid [N, depth],
    and in_vocab [N] (the depth-1 truth is in the draft vocab). `greedy`: `target_greedy(sample,
    lm_head)` when the caller already has it. With `logits`, also the draft's logits [N, depth, Vd]
    and `rows` [N, depth]: the sample position whose target distribution each depth is scored
    against (truth[n, j] = greedy[rows[n, j]]), for measures beyond the argmax.
    """
    ids = sample["input_ids"]  # [T]
    if greedy is None:  # callers measuring many drafts on one sample pass it in (one full-vocab matmul)
        greedy = target_greedy(sample, lm_head)
    truth, valid = chain_truth(ids, greedy, depth)
    s = shift_for_draft(sample)
    dtype = next(drafter.parameters()).dtype
    next_ids = label_ids(s["input_ids"])  # teacher forcing: x_{t+2} at draft position t
    steps = drafter.forward_ttt(s["features"][None].to(dtype), s["input_ids"][None], depth, next_ids=next_ids[None])
    # depth x [1, T-1, Vd]
    logits_all = torch.stack(steps, dim=2)[0]  # [T-1, depth, Vd]
    topk = drafter.to_target_ids(logits_all.topk(min(top_k, logits_all.shape[-1]), dim=-1).indices)
    # draft position t reads x_{t+1} and is labelled with x_{t+2}: both must be answer tokens (the
    # first answer token comes from the target's prefill; after the last one decoding stops)
    starts = sample["loss_mask"][1:].bool() & s["loss_mask"].bool()
    truth, valid = truth[: ids.shape[0] - 1][starts], valid[: ids.shape[0] - 1][starts]
    if drafter.contract.has_vocab_map:
        in_vocab = drafter.t2d[truth[:, 0]]
    else:
        in_vocab = torch.ones_like(truth[:, 0], dtype=torch.bool)
    out = {"pred": topk[starts][..., 0], "topk": topk[starts], "truth": truth, "valid": valid, "in_vocab": in_vocab}
    if logits:
        rows = chain_positions(ids.shape[0], depth)[:-1].clamp(max=ids.shape[0] - 1)
        out |= {"logits": logits_all[starts], "rows": rows[starts]}
    return out


def evaluate_samples(drafter, samples, lm_head: torch.Tensor, *, depth: int = 8, tree_top_k: int = 4,
                     tree_depth: int = 5, progress=None) -> dict:
    """Offline acceptance of `drafter` over captured samples (see the module docstring).

    lm_head: the target's [V, H] output matrix (tied embeddings: the embedding matrix).
    Returns a JSON-ready dict: tokens (chain starts evaluated), acceptance_by_depth, tau_chain
    (k = "1".."depth"), tau_tree (a full top-k tree of tree_depth levels along the greedy path),
    coverage (share of the target's next tokens inside the draft vocab), and the counts.
    """
    parts = []
    with torch.inference_mode():
        for sample in samples:
            if int(sample["loss_mask"].sum()) < 2:
                continue
            parts.append(sample_predictions(drafter, sample, lm_head, depth, tree_top_k))
            if progress is not None:
                progress(int(sample["loss_mask"].shape[0]))
    if not parts:
        raise EyasError("no answer tokens to evaluate", "capture data with responses (loss_mask) first")
    cat = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    chain = chain_acceptance(cat["pred"], cat["truth"], cat["valid"])
    return {
        "tokens": int(cat["truth"].shape[0]),
        **chain,
        "tau_tree": {"top_k": tree_top_k, "depth": tree_depth,
                     "tau": tree_tau(cat["topk"], cat["truth"], cat["valid"], min(tree_depth, depth))},
        "coverage": float(cat["in_vocab"].float().mean()),
    }


def evaluate(
    drafter_path,
    *,
    data=None,
    prompts=None,
    target=None,
    limit: int | None = None,
    max_new_tokens: int = 256,
    depth: int = 8,
    tree_top_k: int = 4,
    tree_depth: int = 5,
    dtype: torch.dtype = torch.bfloat16,
    layer_convention: str | None = None,
    progress: bool = True,
) -> dict:
    """`eyas eval`: load the draft, get features (stored shards, or prompts answered by the target
    now), measure acceptance. Exactly one of `data` (a capture folder) or `prompts` (a prompt file,
    or "mtbench") is used; `target` None is the embedded default.
    """
    drafter, config = load_drafter_and_config(drafter_path, target=target, layer_convention=layer_convention,
                                              dtype=dtype)
    layers = drafter.contract.capture_layers
    if layers is None:
        layers = default_capture_layers(target_config(target)["num_hidden_layers"])
        print(f"warning: {drafter_path} names no capture layers; using the engine default {list(layers)}",
              file=sys.stderr)
    lm_head = target_tensors(target, ["lm_head.weight"])["lm_head.weight"].to(dtype)
    with tempfile.TemporaryDirectory(prefix="eyas-eval-") as tmp:
        if data is None:
            tgt = Target.load(target, dtype=dtype)
            capture(tgt, read_prompts(prompts or "mtbench", limit=limit), layers, tmp,
                    max_new_tokens=max_new_tokens, dtype=dtype, progress=progress)
            data = tmp
        samples = open_shards(data, expect_target=target_name(target))
        if samples.capture_layers != list(layers):  # named here: the draft's side is its config file
            raise ContractError(
                f"{samples.folder / MANIFEST}: captured at layers {samples.capture_layers}, the draft ({config}) "
                f"reads {list(layers)}",
                "capture again with the draft's capture layers",
            )
        bar = tqdm(unit="tok", desc="eval", file=sys.stderr, disable=not progress)
        samples = itertools.islice(samples, limit) if limit else samples
        report = evaluate_samples(drafter, samples, lm_head, depth=depth, tree_top_k=tree_top_k,
                                  tree_depth=tree_depth, progress=bar.update)
        bar.close()
    report["drafter"] = str(resolve_drafter(drafter_path, target))
    report["target"] = str(resolve_target(target))
    report["capture_layers"] = list(layers)
    return report


def plot_report(report: dict, path) -> None:
    """Acceptance by depth and chain tau vs k, side by side, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    acc = report["acceptance_by_depth"]
    a.bar(range(1, len(acc) + 1), acc)
    a.set(xlabel="draft depth", ylabel="acceptance (given earlier accepted)", ylim=(0, 1),
          title="per-depth acceptance")
    ks = sorted(report["tau_chain"], key=int)
    b.plot([int(k) for k in ks], [report["tau_chain"][k] for k in ks], marker="o")
    b.set(xlabel="draft tokens k", ylabel="tau (tokens per target pass)", title="greedy chain tau")
    fig.suptitle(f"{report['drafter']}: {report['tokens']} positions")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
