"""eyas.doctor: a healthy draft is ok; each way real exporters and engines break the wiring is named.

The tiny target is TRAINED (a few seconds) on a synthetic language whose next token is a fixed random
function of the current token and the one two places back: next = TABLE[x_{n-2}, x_n]. That makes
it learnable for a one-layer draft (depth-1 acceptance ~0.8), and makes every wiring matter:
- its layers are trained apart: besides the language, a penalty on the squared cosine between
  every two layers' outputs keeps the residual streams of different layers nearly orthogonal (without
  it layers 3, 4 and 5 have cosine ~0.9, and on an AVX2 machine the doctor measured capture layers
  [1, 2, 4] above [1, 3, 5]). Capture layers off by one or in another order now cost tens of points
  of acceptance, far more than the point or two that another CPU's float kernels move it, so the
  true wiring is measured best on any machine. (One id one layer too shallow costs less: the
  earlier state is smaller, and the draft mostly loses that chunk of three.)
- the draft needs x_{t-1}, which only attention to an earlier position gives it, with a small rope
  theta (10): the rope theta and the positions matter;
- it needs its input token x_{t+1} from its own embedding: the embeddings and d2t matter.
The healthy draft is trained with `eyas.train` once per module; every fault is injected into a copy
of it (through its config or tensors, as real exporters got it wrong) or into an engine dump made
from its correct features, and the FIRST finding must name the fault.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from eyas.data import capture
from eyas.doctor import (
    SLUGS,
    Outcome,
    beats,
    binomial_tail,
    collect,
    diagnose,
    format_report,
    paired_test,
    read_dump,
)
from eyas.doctor.capture import capture_tokens
from eyas.doctor import search
from eyas.doctor.hypotheses import layer_moves
from eyas.doctor.stats import (ACCEPTANCE_ALPHA, MIN_GAIN_LOGPROB, decidable, detectable, held_back,
                               loses_acceptance, signed_rank, smallest_p)
from eyas.errors import FormatError
from eyas.formats import IDS, read_checkpoint, sglang_layer_ids
from eyas.machine import runs_on
from eyas.target import Target
from eyas.train import TrainConfig, train

WORDS = [f"w{i}" for i in range(16)]
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
N_LAYERS, HIDDEN, THETA = 6, 64, 10.0
APART = 4.0  # weight of the layers-apart penalty in the target's loss (`_layers_apart`)
LAYERS = [1, 3, 5]  # what the healthy draft is trained on (not the engine default (2, 3, 3))
LAG = 2  # next = TABLE[x_{n-LAG}, x_n]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run faster on one thread


def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = TEMPLATE
    return fast


def _prompt_texts(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 8))) for _ in range(n)]


def _layers_apart(model: LlamaForCausalLM, ids: Tensor, labels: Tensor) -> Tensor:
    """The language loss plus APART x the mean squared cosine between every two decoder layers' outputs
    at answer positions: near 0 when each layer turns the residual stream somewhere new."""
    outs = []
    hooks = [layer.register_forward_hook(lambda mod, args, out: outs.append(out[0] if isinstance(out, tuple) else out))
             for layer in model.model.layers]
    try:
        loss = model(input_ids=ids, labels=labels).loss
    finally:
        for h in hooks:
            h.remove()
    states = [x[labels >= 0] for x in outs]  # N x [answer positions, H]
    cos = [torch.nn.functional.cosine_similarity(a, b, dim=-1).pow(2).mean()
           for i, a in enumerate(states) for b in states[i + 1:]]
    return loss + APART * torch.stack(cos).mean()


def save_target(folder: Path, steps: int = 200) -> Path:
    """Train the tiny target on the synthetic language (answers only), its layers apart (`_layers_apart`),
    and save it with its tokenizer."""
    tok = _tokenizer()
    tok.save_pretrained(folder)
    V = len(tok)
    g = torch.Generator().manual_seed(0)
    table = len(SPECIALS) + torch.randint(0, len(WORDS), (V, V), generator=g)  # next = table[x_{n-2}, x_n]
    config = LlamaConfig(vocab_size=V, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=N_LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         eos_token_id=tok.eos_token_id, pad_token_id=0, initializer_range=0.4, rope_theta=THETA)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    texts = iter(_prompt_texts(16 * steps, seed=1))
    for _ in range(steps):
        rows = []
        for _ in range(16):
            chat = tok.apply_chat_template([{"role": "user", "content": next(texts)}], tokenize=False,
                                           add_generation_prompt=True)
            ids = tok(chat, add_special_tokens=False)["input_ids"]
            start = len(ids)
            for _ in range(32):
                ids.append(int(table[ids[-1 - LAG], ids[-1]]))
            rows.append((ids, start))
        T = max(len(r) for r, _ in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        labels = torch.full((len(rows), T), -100)
        for b, (r, start) in enumerate(rows):
            ids[b, : len(r)] = torch.tensor(r)
            labels[b, start: len(r)] = torch.tensor(r[start:])
        _layers_apart(model, ids, labels).backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return save_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def healthy(target_dir, tmp_path_factory) -> Path:
    """A draft trained with eyas.train on the target's greedy answers to 300 prompts, at LAYERS."""
    root = tmp_path_factory.mktemp("healthy")
    capture(Target.load(target_dir), _prompt_texts(300, seed=2), LAYERS, root / "data", max_new_tokens=48,
            dtype="float32", progress=False)
    summary = train(TrainConfig(data=str(root / "data"), out=str(root / "run"), target=str(target_dir), draft_vocab=12,
                                ttt_steps=3, lr=3e-3, epochs=6, batch_tokens=256, eval_fraction=0.0, dtype="fp32",
                                save_every=0, progress=False))
    return Path(summary["draft"])


@pytest.fixture(scope="module")
def states(target_dir, tmp_path_factory):
    """The target's states on its answers to 16 held-out prompts, recorded once for every diagnosis."""
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("\n".join(_prompt_texts(16, seed=3)) + "\n")
    return collect(Target.load(target_dir), prompts, limit=16, max_new_tokens=48, progress=False)


# --- fault injection: what real exporters got wrong, applied to a copy of the healthy draft ----------
# (written against the checkpoint, not the tiny target: they apply to any eyas-written draft folder)


def _edit_configs(folder: Path, edit) -> None:
    """Apply `edit(cfg, fmt)` to every config file of a draft folder (speculators and eagle alike)."""
    for name in ("config.json", "config_eagle.json", "config_speculators.json"):
        p = folder / name
        if p.is_file():
            cfg = json.loads(p.read_text())
            edit(cfg, "speculators" if "speculators_config" in cfg else "eagle")
            p.write_text(json.dumps(cfg, indent=2))


def _edit_tensors(folder: Path, edit) -> None:
    t = load_file(folder / "model.safetensors")
    edit(t)
    save_file(t, folder / "model.safetensors")


def _layers_minus_one(d: Path) -> list[int]:
    return [k - 1 for k in read_checkpoint(d, load_tensors=False).contract.capture_layers]


def _set_ids(cfg: dict, fmt: str, ids: list[int]) -> None:
    cfg[IDS] = ids
    if fmt == "eagle":
        cfg["eagle_config"][IDS] = sglang_layer_ids(ids)


def ids_off_by_one(d: Path) -> None:
    """The ids of the layers' OUTPUTS (e.g. [0, 2, 4]) written where capture indices ([1, 3, 5]) belong."""
    ids = _layers_minus_one(d)
    _edit_configs(d, lambda cfg, fmt: _set_ids(cfg, fmt, ids))


def fc_blocks_permuted(d: Path) -> None:
    """fc.weight's column blocks exported in another order ([2, 0, 1]) than the layers are captured in."""
    def edit(t):
        blocks = t["fc.weight"].chunk(3, dim=1)
        t["fc.weight"] = torch.cat([blocks[2], blocks[0], blocks[1]], dim=1).contiguous()
    _edit_tensors(d, edit)


def norm_flag_flipped(d: Path) -> None:
    def edit(cfg, fmt):
        cfg["norm_before_residual"] = True
        if fmt == "eagle":
            cfg["eagle_config"]["norm_before_residual"] = True
    _edit_configs(d, edit)


def random_embeddings(d: Path) -> None:
    """TorchSpec #38: the exporter saved the draft's never-trained (random) embed_tokens."""
    c = read_checkpoint(d, load_tensors=False).contract
    noise = 0.02 * torch.randn(c.vocab_size, c.hidden_size, generator=torch.Generator().manual_seed(5))
    _edit_tensors(d, lambda t: t.update({"embed_tokens.weight": noise}))


def d2t_dropped(d: Path) -> None:
    _edit_tensors(d, lambda t: [t.pop("d2t"), t.pop("t2d")])


def rope_theta_removed(d: Path) -> None:
    """speculators PR #574-style: the converter dropped the rope fields; every engine builds 10000."""
    def edit(cfg, fmt):
        layer = cfg["transformer_layer_config"] if fmt == "speculators" else cfg
        layer.pop("rope_theta", None)
        layer.pop("rope_parameters", None)
    _edit_configs(d, edit)


def flat_config_disagrees(d: Path) -> None:
    """A flat config.json (what engines and from_pretrained read) with off-by-one ids next to a correct
    config_speculators.json (what eyas prefers)."""
    ids = _layers_minus_one(d)
    (d / "config.json").rename(d / "config_speculators.json")
    (d / "config_eagle.json").rename(d / "config.json")
    cfg = json.loads((d / "config.json").read_text())
    _set_ids(cfg, "eagle", ids)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


CHECKPOINT_FAULTS = {
    "capture_layers": ids_off_by_one,
    "concat_order": fc_blocks_permuted,
    "norm_flags": norm_flag_flipped,
    "embeddings": random_embeddings,
    "vocab_map": d2t_dropped,
    "rope": rope_theta_removed,
    "config_file": flat_config_disagrees,
}


# --- engine dumps: what an engine fed the (healthy) draft -----------------------------------------


def write_dump(states, path: Path, layers, *, shift: int = 0, normed: bool = False) -> Path:
    """An engine dump of the first answered prompt: features[t] = the states at `layers` of t + shift
    (clamped), optionally through the target's final norm (the HF module, as an engine would)."""
    s = states.samples[0]
    T = s["input_ids"].shape[0]
    at = (torch.arange(T) + shift).clamp(0, T - 1)
    chunks = [s["states"][at, k] for k in layers]
    if normed:
        with torch.no_grad():
            chunks = [states.target.model.model.norm(x) for x in chunks]
    save_file({"input_ids": s["input_ids"].clone(), "features": torch.cat(chunks, -1).to(torch.bfloat16).contiguous()},
              path)
    return path


DUMP_FAULTS = {  # slug -> (layers, shift, normed)
    "capture_layers": ([k + 1 for k in LAYERS], 0, False),  # SGLang's +1 on ids already meant as capture indices
    "concat_order": (LAYERS[::-1], 0, False),
    "normalized_features": (LAYERS, 0, True),
    "position_shift": (LAYERS, -1, False),  # features of the previous position
    "fc_skipped": ([N_LAYERS], 0, False),  # EAGLE-3 draft served as EAGLE: one H-wide state, fc skipped
}


# --- the statistics -----------------------------------------------------------------------------


def _outcome(first: list[int], accepted: list[int], logprob: list[float] | None = None) -> Outcome:
    lp = torch.tensor(logprob if logprob is not None else [-1.0] * len(first))
    return Outcome(torch.tensor(first, dtype=torch.bool), torch.tensor(accepted), lp, -lp, [0.0] * 5, 1.0)


def test_exact_sign_tests_on_paired_positions():
    assert binomial_tail(10, 10) == 2**-10 and binomial_tail(0, 5) == 1.0
    assert binomial_tail(3, 4) == pytest.approx(5 / 16)  # P(X >= 3), X ~ Bin(4, 1/2)
    base = _outcome([0] * 20 + [1] * 20, [0] * 20 + [2] * 20)
    alt = _outcome([1] * 40, [3] * 40)  # wins the 20 discordant positions, loses none
    t = paired_test(base, alt)
    assert t["depth1_wins_losses"] == [20, 0] and t["p_depth1"] == 2**-20
    assert t["chain_wins_losses"] == [40, 0] and t["gain_depth1"] == pytest.approx(0.5)
    deep = paired_test(base, _outcome([0] * 20 + [1] * 20, [0] * 20 + [4] * 20))  # same depth 1, longer chains
    assert deep["p_depth1"] == 1.0 and deep["p_chain"] == 2**-20  # norm_output-like faults show up only here


def test_divergences_over_two_draft_vocabularies_decide_nothing():
    """KL(target || draft) renormalises the target over the draft vocabulary: another vocab map changes
    what it measures. A trained draft's identity map once measured 6.33 -> 5.23 nats "better" (p 5e-18)
    while every target token lost a nat of log-probability, and was named a vocab_map fault."""
    base = _outcome([0] * 40, [0] * 40)
    alt = _outcome([0] * 40, [0] * 40, [-2.0] * 40)  # each target token loses a nat...
    alt.kl = base.kl - 1.0  # ...and the divergence drops by one
    assert paired_test(base, alt)["p_kl"] < 1e-6  # one vocabulary (or unsaid): compared
    base.vocabulary, alt.vocabulary = (64, 1), (64, 2)
    t = paired_test(base, alt)
    assert not t["kl_compared"] and t["p_kl"] == 1.0 and math.isnan(t["drop_kl"]) and not beats(t, 2)


def test_a_draft_no_better_than_a_uniform_guess_is_trained_for_no_wiring():
    """A draft a few steps into training accepted 0.03-0.16 under the wirings tried, each with a
    log-probability of the target's tokens below a uniform guess's over its vocabulary: what its weights
    lean to is not a fault. One wiring above the guess, or acceptance, and it is trained for something."""
    from eyas.doctor.diagnose import _untrained

    def row(depth1, logprob, uniform=-7.9):
        return {"acceptance_depth1": depth1, "logprob": logprob, "uniform_logprob": uniform}

    section = {"hypotheses": [row(0.158, -12.5), row(0.058, -8.96)], "trained_for": row(0.033, -8.97)}
    assert _untrained(section).startswith("the draft's log-probability of the target's tokens is no better than a "
                                          "uniform guess over its vocabulary under any wiring tried (at best -8.96")
    section["hypotheses"].append(row(0.04, -7.0))
    assert _untrained(section) is None
    section = {"hypotheses": [row(0.01, -3.0)], "trained_for": row(0.02, -2.0)}
    assert _untrained(section) == "depth-1 acceptance is below 0.05 under every wiring tried"


def test_a_dump_is_held_against_the_layers_the_contract_names():
    """What an engine feeds follows the config: a dump (or a cache) at the contract's layers is no
    fault, whatever wiring the draft's weights were measured to fit better (that is the measured
    finding's to say; a cache at the config's layers was once called captured wrong for it)."""
    from types import SimpleNamespace

    from conftest import tiny_contract
    from eyas.doctor.dumps import dump_findings

    c = tiny_contract(capture_layers=(1, 3, 4))
    m = SimpleNamespace(H=c.target_hidden_size, N=6, contract=c, ckpt=SimpleNamespace(tensors={}))
    def at(*layers):
        return [{"chunk": i, "layer": k, "state": "raw", "shift": 0, "rel_error": 0.0, "cosine": 1.0,
                 "identified": True} for i, k in enumerate(layers)]

    assert dump_findings(at(1, 3, 4), 3 * m.H, m, None, None, None, "feature cache", fit=(2, 3, 4)) == []
    # a cache at the layers the weights fit is what they were trained on: the measured finding (fix the
    # config) stands alone, not beside a second one telling to capture again at the config's layers
    assert dump_findings(at(2, 3, 4), 3 * m.H, m, None, None, None, "feature cache", fit=(2, 3, 4)) == []


def test_the_evidence_per_answer_counts_answers_not_positions():
    """Three answers of 30 positions: the first two gain a little at every position, the third loses a
    lot at a few. Over positions the gain is overwhelming; per answer it is 2 of 3, and the third
    answer's loss shows."""
    gain = [0.1] * 60 + [-1.0] * 3 + [0.0] * 27
    base, alt = _outcome([0] * 90, [0] * 90), _outcome([0] * 90, [0] * 90, [-1.0 + g for g in gain])
    base.samples = alt.samples = (30, 30, 30)
    t = paired_test(base, alt)
    assert t["p_logprob"] < 1e-6
    assert t["samples_favouring"] == [2, 3] and t["p_samples"] == pytest.approx(0.5)  # P(X >= 2), X ~ Bin(3, 1/2)
    base.samples = alt.samples = ()  # an outcome that does not say its samples: no per-answer evidence
    assert paired_test(base, alt)["samples_favouring"] == [0, 0]


def _per_answer(means: list[float], positions: int = 60, seed: int = 0) -> dict:
    """The paired test of an alternative whose gain in log-probability averages `means[i]` on answer i
    (plus noise of sd 0.05 at each of its `positions`)."""
    g = torch.Generator().manual_seed(seed)
    gain = torch.cat([m + 0.05 * torch.randn(positions, generator=g) for m in means])
    n = len(gain)
    base = _outcome([0] * n, [0] * n)
    alt = _outcome([0] * n, [0] * n, (-1.0 + gain).tolist())
    base.samples = alt.samples = (positions,) * len(means)
    return paired_test(base, alt)


def test_a_preference_few_answers_hold_is_held_back():
    """Two answers of eight gain much at every position, six lose a little: over positions that is
    overwhelming, across answers it is 2 of 8. Held back, not adopted. The same gain on 7 of 8 answers
    is a fault; on 2 of 3 answers (too few for a sign test to reach its level) positions decide."""
    few = _per_answer([0.3, 0.3] + [-0.02] * 6)
    assert few["p_logprob"] * 50 < 1e-3  # significant over positions in a round of 50 tests
    assert few["samples_favouring"] == [2, 8] and few["samples_favouring_kl"] == [2, 8]
    assert not beats(few, tests=50) and held_back(few, tests=50)
    most = _per_answer([0.05] * 7 + [-0.02])
    assert most["samples_favouring"] == [7, 8] and beats(most, tests=50) and not held_back(most, tests=50)
    short = _per_answer([0.3, 0.3, -0.02])
    assert short["samples_favouring"] == [2, 3] and beats(short, tests=50)
    nothing = _per_answer([0.0] * 8)
    assert not beats(nothing, tests=50) and not held_back(nothing, tests=50)  # not significant anywhere


def test_signed_rank_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(0)
    for n, shift in ((30, 0.0), (200, 0.1), (500, -0.05), (60, 0.5)):
        d = (torch.randn(n, generator=g) + shift).double()
        d[::7] = 0.0  # zero differences are dropped
        d[1::5] = d[1::5].round(decimals=1)  # and tied magnitudes share a rank
        want = scipy_stats.wilcoxon(d.numpy(), zero_method="wilcox", correction=True, alternative="greater",
                                    method="approx").pvalue
        assert signed_rank(d) == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert signed_rank(torch.zeros(10)) == 1.0


def test_continuous_evidence_decides_where_acceptance_cannot():
    """Same argmaxes everywhere (acceptance equal), but the alternative gives the target's token more
    probability at most positions: the signed-rank test on log-probability decides; an equal or
    slightly worse alternative does not win, nor does a consistent gain below MIN_GAIN_LOGPROB."""
    g = torch.Generator().manual_seed(1)
    base_lp = -2.0 + 0.5 * torch.randn(400, generator=g)
    first, accepted = [1] * 200 + [0] * 200, [2] * 200 + [0] * 200
    base = _outcome(first, accepted, base_lp.tolist())
    noise = 0.05 * torch.randn(400, generator=g)
    better = paired_test(base, _outcome(first, accepted, (base_lp + 0.05 + noise).tolist()))
    assert better["p_depth1"] == 1.0 and better["p_logprob"] < 1e-20
    assert better["gain_logprob"] == pytest.approx(0.05, abs=0.01)
    assert beats(better, tests=50)
    same = paired_test(base, _outcome(first, accepted, (base_lp + 0.05 * torch.randn(400, generator=g)).tolist()))
    assert same["p_logprob"] > 0.001 and not beats(same, tests=50)
    tiny = paired_test(base, _outcome(first, accepted, (base_lp + MIN_GAIN_LOGPROB / 2).tolist()))
    assert tiny["p_logprob"] < 1e-20 and not beats(tiny, tests=50)  # consistent, but smaller than rounding
    assert not beats(paired_test(_outcome(first, accepted, (base_lp + 0.05).tolist()), base), tests=1)


def test_a_wiring_that_loses_acceptance_never_wins():
    """An overfit draft fed a smoothed input: more probability on the target's tokens on average and
    less divergence, but fewer argmaxes right. The continuous tests alone would call it better."""
    g = torch.Generator().manual_seed(2)
    base_lp = -2.0 + 0.5 * torch.randn(400, generator=g)
    base = _outcome([1] * 300 + [0] * 100, [2] * 300 + [0] * 100, base_lp.tolist())
    alt = _outcome([1] * 260 + [0] * 140, [2] * 260 + [0] * 140, (base_lp + 0.2).tolist())  # 40 lost, none won
    t = paired_test(base, alt)
    assert t["p_logprob"] < 1e-20 and t["p_kl"] < 1e-20 and t["p_depth1_worse"] < 1e-6
    assert loses_acceptance(t) and not beats(t, tests=50)
    assert not loses_acceptance(paired_test(base, base))  # equal acceptance is no loss
    row = search._row(1, "smoothed", "smoothed", alt, t, 50, False)  # its JSON row shows the p that decided
    assert row["loses_acceptance"] and min(row["p_depth1_worse"], row["p_chain_worse"]) < ACCEPTANCE_ALPHA


def test_detectable_effect_shrinks_with_positions():
    one = detectable([0.2, 0.3, 1.0], positions=400, tests=40)
    assert one == pytest.approx(detectable([0.3], positions=400, tests=40))  # the median spread
    assert detectable([0.3], positions=1600, tests=40) == pytest.approx(one / 2)
    assert detectable([0.3], positions=400, tests=400) > one and detectable([], 400, 40) is None


def test_too_few_positions_name_no_fault_and_promise_none():
    """On 15 positions every wiring of a 46-test round fails Bonferroni however large its gain (smallest p 3.6e-4):
    the doctor said ok and that 0.685 nats would have been found, beside a 4.8-nat norm flag."""
    assert smallest_p(15) == pytest.approx(3.6e-4, rel=0.05) and signed_rank(torch.arange(1.0, 16.0)) == smallest_p(15)
    assert not decidable(15, 46) and decidable(17, 46) and decidable(15, 10)
    assert detectable([0.3], positions=15, tests=46) is None and detectable([0.3], positions=17, tests=46) > 0


# --- the healthy draft and the injected faults ---------------------------------------------------


@pytest.fixture(scope="module")
def healthy_report(healthy, states):
    return diagnose(healthy, capture=states, progress=False)


def test_too_few_positions_are_grown_then_said_inconclusive(healthy, target_dir, tmp_path):
    """A capture too short for any wiring to pass its round's Bonferroni answers more prompts (twice the answers,
    at most twice), and where that is still too few the verdict is inconclusive, not ok (exit 0: nothing found)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(_prompt_texts(2, seed=7)) + "\n")
    cap = collect(Target.load(target_dir), prompts, limit=1, max_new_tokens=3, progress=False)
    rep = diagnose(healthy, capture=cap, progress=False)
    assert rep["measured"]["data"].startswith("2 prompts") and not rep["measured"]["decidable"]
    assert any(n.startswith(f"{cap.positions} positions are too few") and "answered 1 more prompt to settle it" in n
               for n in rep["notes"]), rep["notes"]
    assert rep["verdict"] == "inconclusive" and rep["inconclusive"].endswith("or more can be)"), rep["inconclusive"]
    assert rep["measured"]["detectable_logprob"] is None and not any("would have been found" in n for n in rep["notes"])
    assert format_report(rep).splitlines()[0].endswith(f"INCONCLUSIVE: {rep['inconclusive']}")


def test_a_capture_of_answers_extends_with_the_next_prompts(target_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(_prompt_texts(6, seed=5)) + "\n")
    cap = collect(Target.load(target_dir), prompts, limit=2, max_new_tokens=8, progress=False)
    more = cap.extended(progress=False)
    assert more is cap.extended(progress=False)  # a shared capture answers its next prompts once
    assert len(more.samples) == 4 and more.samples[:2] == cap.samples and more.used == 4
    assert more.source.startswith("4 prompts") and more.seconds >= cap.seconds
    last = more.extended(progress=False)  # twice 4 asked, 2 left
    assert len(last.samples) == 6 and last.extended(progress=False) is None  # the file is used up
    assert capture_tokens(cap.target, cap.samples[0]["input_ids"], "given").extended() is None


def test_answers_that_disagree_with_the_positions_are_doubled(healthy, target_dir, tmp_path, monkeypatch):
    """While a wiring is significant over positions but not across answers the doctor measures twice
    the answers, at most twice; here the doubt holds on the first 4 answers only."""
    import eyas.doctor.search as search
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(_prompt_texts(12, seed=6)) + "\n")
    cap = collect(Target.load(target_dir), prompts, limit=4, max_new_tokens=24, progress=False)
    doubted = cap.positions
    monkeypatch.setattr(search, "held_back", lambda test, tests: test["positions"] == doubted)
    rep = diagnose(healthy, capture=cap, progress=False)
    assert rep["measured"]["data"].startswith("8 prompts") and rep["measured"]["positions"] > doubted
    assert sum("not across answers" in n and "answered 4 more prompts" in n for n in rep["notes"]) == 1
    monkeypatch.setattr(search, "held_back", lambda test, tests: True)
    rep = diagnose(healthy, capture=cap, progress=False)  # doubted however many: 4 -> 8 -> 12 (the file's end)
    assert rep["measured"]["data"].startswith("12 prompts")
    assert any("not named a fault" in n for n in rep["notes"])


def test_healthy_draft_is_ok(healthy_report):
    rep = healthy_report
    assert rep["verdict"] == "ok" and rep["findings"] == [], format_report(rep)
    assert f"s) on {runs_on(torch.device('cpu'))}" in format_report(rep)  # what its seconds ran on
    m = rep["measured"]
    assert m["contract"]["acceptance_depth1"] > 0.6 and m["positions"] > 500
    assert m["trained_for"] == m["contract"]
    measured = {r["fault"] for r in m["hypotheses"]}  # every wiring the draft can have was tried
    # no own embeddings, one config; fc skipped and unmatched features are said of engine dumps only
    assert measured == set(SLUGS) - {"fc_skipped", "config_file", "embeddings", "unmatched_features"}
    assert all(not r["significant"] for r in m["hypotheses"])
    assert all(r["acceptance_depth1"] < m["contract"]["acceptance_depth1"] + 0.02 for r in m["hypotheses"])
    assert "capture layers [1, 3, 5]" in rep["trained_for"]
    assert rep["static"]["problems"] and rep["hazards"] == []  # the local verifier path: not an acceptance fault


def test_a_bounded_cache_of_target_log_probs_gives_the_same_diagnosis(healthy, states, healthy_report, monkeypatch):
    """The target's log-probability tables are kept up to a byte budget; at 1 byte only the table in
    use is held, every other is recomputed, and every figure stays the same."""
    import eyas.doctor.measure as measure

    held, compute = [], measure.Measurer._target_log_probs

    def spy(self, *args):
        table = compute(self, *args)
        held.append(len(self._log_p))
        return table
    monkeypatch.setattr(measure, "LOG_P_BYTES", 1)
    monkeypatch.setattr(measure.Measurer, "_target_log_probs", spy)
    rep = diagnose(healthy, capture=states, progress=False)
    assert held and max(held) == 1
    assert rep["measured"] == healthy_report["measured"] and rep["findings"] == healthy_report["findings"]


@pytest.mark.parametrize("slug", CHECKPOINT_FAULTS)
def test_checkpoint_fault_is_named_first(slug, healthy, states, tmp_path):
    draft = shutil.copytree(healthy, tmp_path / "draft")
    CHECKPOINT_FAULTS[slug](draft)
    rep = diagnose(draft, capture=states, progress=False)
    assert rep["verdict"] == "faulty"
    first = rep["findings"][0]
    assert first["fault"] == slug, format_report(rep)
    assert first["acceptance_after"] > first["acceptance_before"] + 0.1
    assert first["acceptance_after"] == rep["measured"]["trained_for"]["acceptance_depth1"]
    assert f" of {len(states.samples)} answers (sign test p = " in first["evidence"], first["evidence"]
    layers = [5, 1, 3] if slug == "concat_order" else LAYERS  # fc's blocks, as injected, read [5, 1, 3]
    assert f"capture layers {layers}" in rep["trained_for"] and "rope theta 10," in rep["trained_for"], format_report(rep)


def test_fixes_name_the_exact_change(healthy, states, tmp_path):
    fixes = {}
    for slug in ("capture_layers", "concat_order", "rope", "config_file"):
        draft = shutil.copytree(healthy, tmp_path / slug)
        CHECKPOINT_FAULTS[slug](draft)
        fixes[slug] = diagnose(draft, capture=states, progress=False)["findings"][0]["fix"]
    assert f"in config.json set {IDS} = [1, 3, 5]" in fixes["capture_layers"]
    assert f"eagle_config.{IDS} = [1, 3, 5]" in fixes["capture_layers"]  # config_eagle.json, for SGLang
    assert "new block i = current block [1, 2, 0][i]" in fixes["concat_order"]  # undoes the injected [2, 0, 1]
    assert "transformer_layer_config.rope_theta = 10.0" in fixes["rope"]
    assert "fit config_speculators.json: delete config.json" in fixes["config_file"]


def test_a_wrong_file_no_one_reads_and_a_theta_in_both_spellings_get_fixes_that_fix_them(healthy, states, tmp_path):
    """Only config_eagle.json off by one: measured as that file's fault (it said it could not tell which file was
    right). A wrong rope_theta stated twice (rope_theta and rope_parameters.rope_theta): the fix sets both (it left
    rope_parameters wrong, which transformers 5 reads)."""
    draft = shutil.copytree(healthy, tmp_path / "eagle_only_wrong")
    cfg = json.loads((draft / "config_eagle.json").read_text())
    _set_ids(cfg, "eagle", _layers_minus_one(draft))
    (draft / "config_eagle.json").write_text(json.dumps(cfg, indent=2))
    first = diagnose(draft, capture=states, progress=False)["findings"][0]
    assert first["fault"] == "config_file" and first["source"] == "measured", first
    assert first["title"] == "config_eagle.json (read by nobody by default) does not fit the weights; config.json does"

    def wrong_theta(cfg, fmt):
        layer = cfg["transformer_layer_config"] if fmt == "speculators" else cfg
        layer["rope_theta"], layer["rope_parameters"] = 10000.0, {"rope_type": "default", "rope_theta": 10000.0}

    draft = shutil.copytree(healthy, tmp_path / "theta")
    _edit_configs(draft, wrong_theta)
    fix = diagnose(draft, capture=states, progress=False)["findings"][0]["fix"]
    assert f"transformer_layer_config.rope_parameters.rope_theta = {THETA}" in fix, fix
    assert f"in config_eagle.json set rope_theta = {THETA} and rope_parameters.rope_theta = {THETA}" in fix, fix


def test_a_rope_scaling_the_draft_was_not_trained_with_is_named(healthy, states, tmp_path):
    """Hunyuan's NTK-alpha in the config of a draft trained on plain rope (AngelSlim's trainer ignores
    alpha): engines turn it at theta * 100^(16/14) = 1.9e3 instead of 10; the doctor names plain rope
    and the edit that records it."""
    draft = shutil.copytree(healthy, tmp_path / "draft")

    def edit(cfg, fmt):
        layer = cfg["transformer_layer_config"] if fmt == "speculators" else cfg
        layer["rope_scaling"] = {"rope_type": "dynamic", "factor": 1.0, "alpha": 100.0}
        layer["rope_parameters"] = {**layer["rope_scaling"], "rope_theta": THETA}
    _edit_configs(draft, edit)
    rep = diagnose(draft, capture=states, progress=False)
    first = rep["findings"][0]
    assert rep["verdict"] == "faulty" and first["fault"] == "rope", format_report(rep)
    assert first["acceptance_after"] > first["acceptance_before"] + 0.1
    assert "transformer_layer_config.rope_scaling = null" in first["fix"]
    assert "rope theta 10," in rep["trained_for"] and "rope_scaling" not in rep["trained_for"], format_report(rep)


def test_layer_moves_include_joint_shifts():
    moves = dict((layers, name) for name, layers in layer_moves((1, 3, 5)))
    for d in (-2, -1, 1, 2):  # a convention fault moves every id
        assert moves[tuple(k + d for k in (1, 3, 5))] == f"capture layers {d:+d}"
    assert moves[(1, 2, 5)] == "layer 3 -1" and moves[(1, 3, 6)] == "layer 5 +1"
    assert len(moves) == 4 + 3 * 2


def test_layer_search_does_not_stop_beside_the_truth(healthy, states, tmp_path):
    """Two of three ids one too deep ([2, 4, 5]): no move of a round (all ids together, or one alone)
    reaches [1, 3, 5], so the round's best is at most a neighbour of it; the search climbs on to the
    layers the weights fit. (Ids one too shallow are a weaker test here: layer 0, the embeddings, is
    so small next to layer 1 that the draft fed it mostly loses one chunk of three.)"""
    draft = shutil.copytree(healthy, tmp_path / "draft")
    _edit_configs(draft, lambda cfg, fmt: _set_ids(cfg, fmt, [2, 4, 5]))
    rep = diagnose(draft, capture=states, progress=False)
    first = rep["findings"][0]
    assert first["fault"] == "capture_layers", format_report(rep)
    assert "capture layers [1, 3, 5]," in rep["trained_for"] and "[1, 3, 5]" in first["fix"]
    assert first["acceptance_after"] == rep["measured"]["trained_for"]["acceptance_depth1"]


def test_two_faults_are_found_one_after_the_other(healthy, states, tmp_path):
    """Adopting the first fix and re-testing finds the second fault hiding behind it."""
    draft = shutil.copytree(healthy, tmp_path / "draft")
    ids_off_by_one(draft)
    norm_flag_flipped(draft)
    rep = diagnose(draft, capture=states, progress=False)
    assert sorted(f["fault"] for f in rep["findings"]) == ["capture_layers", "norm_flags"]
    assert rep["measured"]["trained_for"]["acceptance_depth1"] == pytest.approx(
        rep["measured"]["contract"]["acceptance_depth1"] + sum(
            f["acceptance_after"] - f["acceptance_before"] for f in rep["findings"]), abs=1e-3)


def test_a_consumer_that_wires_it_worse_is_a_serving_fault(healthy, states, tmp_path):
    """norm_before_residual absent: speculators reads false (right here), vLLM's speculators path true."""
    draft = shutil.copytree(healthy, tmp_path / "draft")
    _edit_configs(draft, lambda cfg, fmt: [cfg.pop("norm_before_residual"),
                                           cfg.get("eagle_config", {}).pop("norm_before_residual", None)])
    rep = diagnose(draft, capture=states, progress=False)
    first = rep["findings"][0]
    assert (first["fault"], first["source"], first["consumers"]) == ("norm_flags", "serving", ["vllm"])
    assert "norm_before_residual = false" in first["fix"]
    assert any(h["consumer"] == "vllm" and h["fault"] == "norm_flags" for h in rep["hazards"])


@pytest.mark.parametrize("slug", DUMP_FAULTS)
def test_engine_dump_fault_is_named_first(slug, healthy, states, tmp_path):
    layers, shift, normed = DUMP_FAULTS[slug]
    dump = write_dump(states, tmp_path / "dump.safetensors", layers, shift=shift, normed=normed)
    rep = diagnose(healthy, capture=states, features=dump, progress=False)
    first = rep["findings"][0]
    assert (first["fault"], first["source"]) == (slug, "engine dump"), format_report(rep)
    chunks = rep["dump"]["chunks"]
    assert [c["layer"] for c in chunks] == layers and all(c["identified"] for c in chunks)
    assert all(c["shift"] == shift and (c["state"] == "final_norm") == normed for c in chunks)
    assert first["acceptance_before"] < first["acceptance_after"]
    if slug == "capture_layers":  # the configs record the ids rightly: the fix restated them as an edit
        assert "the configs need no edit" in first["fix"] and " set " not in first["fix"], first["fix"]


def test_a_correct_engine_dump_is_ok(healthy, states, tmp_path):
    dump = write_dump(states, tmp_path / "dump.safetensors", LAYERS)
    rep = diagnose(healthy, capture=states, features=dump, progress=False)
    assert rep["verdict"] == "ok", format_report(rep)
    assert rep["measured"]["data"] == states.source and rep["dump"]["positions"] == states.samples[0]["input_ids"].shape[0]
    assert rep["dump"]["acceptance_on_dump"]["acceptance_depth1"] == pytest.approx(
        rep["dump"]["acceptance_on_correct_features"]["acceptance_depth1"], abs=0.02)  # bf16 dump vs fp32


def test_a_dump_that_matches_no_state_and_costs_acceptance_is_a_fault(healthy, states, tmp_path):
    """Noise of the right width: no chunk is a state of the target and the draft does worse on it than on
    correct features: a finding (exit 1), not an OK verdict on the draft's own wiring."""
    dump = write_dump(states, tmp_path / "dump.safetensors", LAYERS)
    t = load_file(dump)
    t["features"] = torch.randn(t["features"].shape, generator=torch.Generator().manual_seed(0)).to(t["features"].dtype)
    save_file(t, dump)
    rep = diagnose(healthy, capture=states, features=dump, progress=False)
    assert not any(c["identified"] for c in rep["dump"]["chunks"])
    assert rep["verdict"] == "faulty" and [f["fault"] for f in rep["findings"]] == ["unmatched_features"]
    f = rep["findings"][0]
    assert f["acceptance_before"] < f["acceptance_after"] and "--target" in f["fix"]
    assert "unjudged" not in format_report(rep).splitlines()[0]


def test_one_unmatched_chunk_that_costs_acceptance_is_a_fault(healthy, states, tmp_path):
    """Noise in the last of three chunks: the other two match, yet the draft does worse on the dump."""
    dump = write_dump(states, tmp_path / "dump.safetensors", LAYERS)
    t = load_file(dump)
    f, H = t["features"].clone(), t["features"].shape[1] // 3
    f[:, 2 * H:] = torch.randn(f[:, 2 * H:].shape, generator=torch.Generator().manual_seed(0)).to(f.dtype)
    save_file({**t, "features": f.contiguous()}, dump)
    rep = diagnose(healthy, capture=states, features=dump, progress=False)
    assert [c["identified"] for c in rep["dump"]["chunks"]] == [True, True, False]
    assert rep["verdict"] == "faulty" and rep["findings"][0]["fault"] == "unmatched_features", format_report(rep)
    assert "chunk [2] of features" in rep["findings"][0]["title"]


def test_a_dump_that_matches_no_state_but_costs_nothing_stays_unjudged(healthy, states, tmp_path, monkeypatch):
    """Where the draft does as well on the unmatched features (here: the matcher made blind), the verdict
    stays OK and says the fed features are unjudged."""
    import eyas.doctor.dumps as dumps

    monkeypatch.setattr(dumps, "MATCH_COSINE", 1.01)  # no chunk can match; the features are the right ones
    rep = diagnose(healthy, capture=states, features=write_dump(states, tmp_path / "d.safetensors", LAYERS),
                   progress=False)
    assert not any(c["identified"] for c in rep["dump"]["chunks"]) and rep["verdict"] == "ok", format_report(rep)
    assert "the dump matches none of the target's states" in format_report(rep).splitlines()[0]


@pytest.fixture(scope="module")
def answers_cache(target_dir, tmp_path_factory):
    """eyas's own capture of the target's answers to 12 held-out prompts at LAYERS: a trainer's cache."""
    folder = tmp_path_factory.mktemp("cache") / "cache"
    capture(Target.load(target_dir), _prompt_texts(12, seed=4), LAYERS, folder, max_new_tokens=24, dtype="float32",
            progress=False)
    return folder


def test_a_cache_feeds_its_samples_cut_after_their_first_answer_tokens(target_dir, answers_cache):
    from eyas.data import open_shards
    from eyas.data.caches import open_cache
    from eyas.doctor.caches import CacheFeed
    from eyas.doctor.capture import collect_from

    feed = CacheFeed(open_cache(answers_cache, num_layers=N_LAYERS), answer_tokens=10)
    whole = list(open_shards(answers_cache))
    cut = feed.windows(0, 12)
    assert len(cut) == 12 and [int(w["loss_mask"].sum()) for w in cut] == [10] * 12
    for w, s in zip(cut, whole):  # a prefix, ending on its 10th answer token
        T = w["input_ids"].shape[0]
        assert torch.equal(w["input_ids"], s["input_ids"][:T]) and w["loss_mask"][-1]
        assert torch.equal(w["features"], s["features"][:T])
    assert torch.equal(feed.first()[0], cut[0]["input_ids"])
    cap = collect_from(Target.load(target_dir), feed, 5, progress=False)
    assert cap.used == 5 and cap.source.startswith("5 samples of feature cache")
    more = cap.extended(progress=False)  # twice the samples: 5 more
    assert more.used == 10 and more.samples[:5] == cap.samples and len(more.samples) == 10
    assert len(more.extended(progress=False).samples) == 12 and feed.more(2) == "measured 2 more samples of the cache"


def test_a_cache_without_a_position_to_measure_is_refused(target_dir, answers_cache, tmp_path):
    from eyas.data.caches import open_cache
    from eyas.doctor.caches import CacheFeed

    class Unanswered:  # every sample's loss mask off: nothing the draft was trained to predict
        info = open_cache(answers_cache, num_layers=N_LAYERS).info

        def __iter__(self):
            for s in open_cache(answers_cache, num_layers=N_LAYERS):
                yield {**s, "loss_mask": torch.zeros_like(s["loss_mask"])}

    with pytest.raises(FormatError, match="no sample with two consecutive loss-mask positions"):
        CacheFeed(Unanswered(), answer_tokens=10).first()


def test_the_doctor_measures_a_cache_on_its_first_samples(healthy, target_dir, answers_cache, tmp_path):
    """Every wiring is measured on the target's states for the cache's first `limit` samples (so the
    answers' sign test applies), and the first sample is matched against those states."""
    rep = diagnose(healthy, target=target_dir, features=answers_cache, limit=6, max_new_tokens=20, progress=False)
    # Trained for LAYERS, the tiny draft's floats differ by CPU: on an AMX Xeon its weights measure layer 2 in
    # place of 3 better on these answers (log-probability, not depth-1 acceptance); the cache is then blamed
    # for that, and for nothing else.
    faults = {(f["fault"], f["acceptance_after"] > f["acceptance_before"]) for f in rep["findings"]}
    assert rep["verdict"] == "ok" or faults == {("capture_layers", False)}, format_report(rep)
    assert rep["measured"]["data"].startswith("6 samples of feature cache")
    assert [c["layer"] for c in rep["dump"]["chunks"]] == LAYERS and rep["cache"]["format"] == "eyas"
    assert any("--limit 24 halves what can" in n for n in rep["notes"]) or rep["verdict"] != "ok"
    assert f"feature cache (its first sample) {answers_cache}:" in format_report(rep)
    # the draft on the cache's own features and on correct ones: the same samples, so a correctly taken
    # (fp32) cache loses nothing (it once compared the first sample with all six)
    on, correct = rep["dump"]["acceptance_on_dump"], rep["dump"]["acceptance_on_correct_features"]
    assert rep["dump"]["samples_measured"] == 6
    assert on["acceptance_depth1"] == pytest.approx(correct["acceptance_depth1"], abs=0.02)
    assert "draft on the cache's features (6 samples)" in format_report(rep)
    deeper = tmp_path / "deeper"  # the same answers captured one layer deeper than the draft reads
    capture(Target.load(target_dir), _prompt_texts(12, seed=4), [k + 1 for k in LAYERS], deeper, max_new_tokens=24,
            dtype="float32", progress=False)
    rep = diagnose(healthy, target=target_dir, features=deeper, limit=6, max_new_tokens=20, progress=False)
    first = rep["findings"][0]
    assert (first["fault"], first["source"]) == ("capture_layers", "feature cache"), format_report(rep)
    assert first["evidence"].startswith("feature cache: ")
    # the cache is at fault, not the draft's config (which already names LAYERS) nor an engine
    assert first["title"] == f"the cache holds layers {[k + 1 for k in LAYERS]}; the draft reads {LAYERS}"
    assert first["fix"].startswith(f"capture the cache again at capture layers {LAYERS} (one layer deeper")
    assert [c["layer"] for c in rep["dump"]["chunks"]] == [k + 1 for k in LAYERS] == rep["cache"]["layers_found"]
    assert f"the cache's first sample holds capture {[k + 1 for k in LAYERS]}, as recorded" in rep["notes"]


def test_dump_reader_takes_vllm_files_and_refuses_others(tmp_path):
    vllm = tmp_path / "vllm.safetensors"
    save_file({"token_ids": torch.arange(6), "hidden_states": torch.randn(6, 3, 4)}, vllm)
    ids, feats = read_dump(vllm)
    assert ids.tolist() == list(range(6)) and feats.shape == (6, 12)
    bad = tmp_path / "bad.safetensors"
    save_file({"input_ids": torch.arange(6), "features": torch.randn(5, 8)}, bad)
    with pytest.raises(FormatError, match="expected int64 \\[T\\] and float \\[T, W\\]"):
        read_dump(bad)
    save_file({"tokens": torch.arange(6)}, bad)
    with pytest.raises(FormatError, match=r"no features, input_ids \(it holds 1 tensor: tokens\)"):
        read_dump(bad)
    save_file({f"model.layers.{i}.mlp.weight": torch.zeros(2) for i in range(40)}, bad)  # a model's weights
    with pytest.raises(FormatError) as e:  # its header said so; it listed all 40 names on the error line
        read_dump(bad)
    assert str(e.value).endswith("(it holds 40 tensors: model.layers.0.mlp.weight, model.layers.1.mlp.weight, "
                                 "model.layers.10.mlp.weight, model.layers.11.mlp.weight, model.layers.12.mlp.weight, "
                                 "model.layers.13.mlp.weight and 34 more)")
    (tmp_path / "junk.safetensors").write_text("not safetensors")
    with pytest.raises(FormatError, match="not a readable safetensors file"):
        read_dump(tmp_path / "junk.safetensors")


def test_a_config_that_makes_vllm_skip_fc_is_a_static_finding(healthy, states, tmp_path):
    draft = shutil.copytree(healthy, tmp_path / "draft")
    (draft / "config.json").rename(draft / "config_speculators.json")
    cfg = json.loads((draft / "config_eagle.json").read_text())
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    (draft / "config.json").write_text(json.dumps(cfg))
    (draft / "config_eagle.json").unlink()
    rep = diagnose(draft, capture=states, progress=False)
    skipped = [f for f in rep["findings"] if f["fault"] == "fc_skipped"]
    assert [f["fix"] for f in skipped] == ["in config.json set eagle_config.use_aux_hidden_state = true"]
    # the flat config.json also exposes SGLang's +1 on eagle_config ids that start at 1: [2, 4, 6]
    assert any(h["consumer"] == "sglang" and "[2, 4, 6]" in h["hazard"] for h in rep["hazards"])


def test_a_dump_from_another_target_is_refused(healthy, states, tmp_path):
    bad = tmp_path / "dump.safetensors"
    save_file({"input_ids": torch.arange(8), "features": torch.randn(8, 3 * HIDDEN + 1)}, bad)
    with pytest.raises(FormatError, match="not a multiple of the hidden size 64"):
        diagnose(healthy, target=states.target.path, features=bad, progress=False)
    save_file({"input_ids": torch.arange(8) + 1000, "features": torch.randn(8, 3 * HIDDEN)}, bad)
    with pytest.raises(FormatError, match="outside the vocab"):
        diagnose(healthy, target=states.target.path, features=bad, progress=False)


def test_without_weights_only_static_findings(healthy, states, tmp_path):
    draft = shutil.copytree(healthy, tmp_path / "draft")
    (draft / "model.safetensors").unlink()
    rep = diagnose(draft, capture=states, progress=False)
    assert rep["measured"] is None and any("not measured" in n for n in rep["notes"])
    assert any(p["field"] == "weights" for p in rep["static"]["problems"])


def test_readable_report(healthy, healthy_report, states, tmp_path):
    text = format_report(healthy_report)
    assert text.splitlines()[0].endswith("OK: no fault found") and "the weights fit: capture layers [1, 3, 5]" in text
    draft = shutil.copytree(healthy, tmp_path / "draft")
    fc_blocks_permuted(draft)
    rep = diagnose(draft, capture=states, progress=False)
    text = format_report(rep)
    assert "FAULTY: 1 finding" in text and "1. [concat_order]" in text and "fix: permute fc.weight" in text
    assert json.loads(json.dumps(rep)) == rep  # the report is JSON as it stands
