"""eyas.decode: speculative decoding must give the target's own greedy output, token for token (fp32),
and the target's own sampling distribution, exactly.

Tiny random targets and drafters are built in code. A random drafter is almost never right, so a
"cheating" drafter (below) that often proposes the target's own continuation exercises multi-token
acceptance, rejection, bonus tokens and the gathering of accepted tree branches in the KV cache.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import random_tensors, tiny_contract
from scipy.stats import chi2, chisquare
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import eyas.decode.loop as loop
from eyas.contract import Verifier
from eyas.decode import (
    DraftTree,
    Sampling,
    draft_step0,
    draw,
    generate,
    keep_accepted_kv,
    propose_chain,
    propose_tree,
    verify,
    warp_probs,
)
from eyas.drafter import DraftCache, Drafter
from eyas.errors import ContractError, EyasError
from eyas.target import Chat, Target
from eyas.target_context import decode_context, longrope_length, sliding_window

GREEDY_TARGET = dict(  # the shapes of conftest's tiny draft contract: hidden 64, vocab 256, 6 layers
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
)
# Sampling is checked against the target's exact next-token distributions over a tiny vocabulary.
SAMPLING_TARGET = dict(
    vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def build_target(folder: Path, seed: int, **config) -> Target:
    """A random Llama saved to `folder` and loaded back through Target.load.

    initializer_range 0.3 (instead of 0.02) gives logits that are neither flat nor one-hot: greedy
    choices are not decided by rounding, and sampled tokens are neither uniform nor fixed.
    No bos/eos: Hugging Face generate would otherwise stop or suppress token ids 1/2.
    """
    torch.manual_seed(seed)
    model = LlamaForCausalLM(
        LlamaConfig(**config, initializer_range=0.3, tie_word_embeddings=False,
                    bos_token_id=None, eos_token_id=None, pad_token_id=None)
    )
    model.save_pretrained(folder)
    return Target.load(folder)


def embeddings(target: Target) -> torch.Tensor:
    return target.model.get_input_embeddings().weight.detach().clone()


class CheatDrafter(Drafter):
    """A drafter that often knows the answer, for tests only.

    It rebuilds every query's token prefix from the draft-cache slots the query attends to (the
    step-0 slot at position t holds x_{t+1}; tree and chain slots hold their own tokens), and with
    probability `hit` replaces its random guess by `oracle(prefix)`: a target token id (boosted to
    the top) or target-vocab logits (used as its own). In a causal call only the last position's
    output becomes a proposal, so only that one is doctored.
    """

    def arm(self, first_token: int, oracle, hit: float, seed: int) -> CheatDrafter:
        self.first, self.oracle, self.hit, self.rng = first_token, oracle, hit, random.Random(seed)
        self.slots: list[int] = []
        self.vocab_map = self.to_target_ids(torch.arange(self.contract.draft_vocab_size))
        return self

    def forward(self, hidden, input_ids, position_ids, *, cache=None, attn_mask=None):
        past = cache.length
        del self.slots[past:]  # the cache was cropped since the last call
        self.slots += input_ids[0].tolist()
        logits, next_hidden = super().forward(hidden, input_ids, position_ids, cache=cache, attn_mask=attn_mask)
        T = input_ids.shape[1]
        for i in range(T) if attn_mask is not None else [T - 1]:
            if self.rng.random() >= self.hit:
                continue
            seen = range(past + i + 1) if attn_mask is None else attn_mask[0, i].nonzero().flatten().tolist()
            guess = self.oracle([self.first] + [self.slots[j] for j in seen])
            if isinstance(guess, int):
                where = (self.vocab_map == guess).nonzero().flatten()
                if len(where):
                    logits[0, i, where[0]] = logits[0, i].max() + 10.0
            elif guess is not None:
                logits[0, i] = guess[self.vocab_map]
        return logits, next_hidden


def random_drafter(target: Target, contract, seed: int = 0) -> Drafter:
    return Drafter.from_tensors(contract, random_tensors(contract, seed), embed_tokens=embeddings(target))


def cheat_drafter(target: Target, contract, seed: int = 0) -> CheatDrafter:
    return CheatDrafter.from_tensors(contract, random_tensors(contract, seed), embed_tokens=embeddings(target))


# --- greedy: token-identical to the target alone ---------------------------------------------------

N_PROMPTS = 20


def prompt_plan(i: int) -> tuple[torch.Tensor, int]:
    """Prompt i: random ids of length 1..40 and a generation length (two long ones: 200 and 120)."""
    g = torch.Generator().manual_seed(100 + i)
    length = [1, 3, 40, 7][i] if i < 4 else int(torch.randint(2, 41, (), generator=g))
    new = {0: 200, 1: 120}.get(i) or int(torch.randint(8, 33, (), generator=g))
    return torch.randint(0, GREEDY_TARGET["vocab_size"], (1, length), generator=g), new


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Target:
    return build_target(tmp_path_factory.mktemp("greedy-target"), 0, **GREEDY_TARGET)


@pytest.fixture(scope="module")
def references(big) -> list[torch.Tensor]:
    """Hugging Face greedy decoding of each prompt: the ground truth."""
    refs = []
    for i in range(N_PROMPTS):
        prompt, new = prompt_plan(i)
        refs.append(big.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                       max_new_tokens=new, pad_token_id=0))
    return refs


def greedy_oracle(reference: torch.Tensor):
    """The target's greedy next token after `prefix`, when the prefix is on the reference path."""
    ref = reference[0].tolist()

    def oracle(prefix: list[int]) -> int | None:
        on_path = len(prefix) < len(ref) and prefix == ref[: len(prefix)]
        return ref[len(prefix)] if on_path else None

    return oracle


GREEDY_CASES = {  # name: (drafter kind, options)
    "target-only": (None, {}),
    "chain-random": ("random", {"draft_tokens": 3}),
    "chain-cheat": ("cheat", {"draft_tokens": 5}),
    "tree-random": ("random", {"tree": (3, 3, 8)}),
    "tree-cheat": ("cheat", {"tree": (5, 3, 12)}),
}


@pytest.mark.parametrize("case", sorted(GREEDY_CASES))
def test_greedy_matches_target(big, references, case, monkeypatch):
    kind, options = GREEDY_CASES[case]
    kept_paths = []  # accepted node lists: a tree must sometimes keep a branch that is not a prefix
    keep = loop.keep_accepted_kv

    def spy(cache, n, nodes):
        kept_paths.append(nodes)
        keep(cache, n, nodes)

    monkeypatch.setattr(loop, "keep_accepted_kv", spy)  # the name generate calls
    # the random draft predicts 64 of the 256 tokens (vocab map); the cheat sees the full vocab
    contract = tiny_contract() if kind == "random" else tiny_contract(draft_vocab_size=256)
    drafter = {None: lambda: None, "random": lambda: random_drafter(big, contract),
               "cheat": lambda: cheat_drafter(big, contract)}[kind]()
    totals = Counter()
    for i in range(N_PROMPTS):
        prompt, new = prompt_plan(i)
        if kind == "cheat":
            drafter.arm(int(prompt[0, 0]), greedy_oracle(references[i]), hit=0.7, seed=i)
        streamed = []
        out, stats = generate(big, drafter, prompt, max_new_tokens=new, on_tokens=streamed.extend, **options)
        assert out.tolist() == references[i].tolist(), f"{case}: prompt {i} differs from HF greedy"
        assert streamed == out[0, prompt.shape[1]:].tolist()
        assert stats["new_tokens"] == new
        assert sum(stats["accept_counts"]) == stats["rounds"]
        # a round emits accepted + 1 tokens; the prefill emits the first; nothing was truncated here
        assert sum((a + 1) * c for a, c in enumerate(stats["accept_counts"])) == new - 1
        totals.update({a: c for a, c in enumerate(stats["accept_counts"])})
    if kind == "cheat":  # multi-token acceptance, full acceptance and rejection all happened
        depth = options.get("draft_tokens") or options["tree"][0]
        assert totals[0] > 0 and totals[1] > 0 and totals[depth] > 0, totals
        assert sum(a * c for a, c in totals.items()) / sum(totals.values()) > 1.0
        gathered = [nodes for nodes in kept_paths if nodes != list(range(len(nodes)))]
        assert bool(gathered) == ("tree" in options), "tree branches must be gathered, chains cropped"
    if kind is None:
        assert set(totals) == {0}


def test_stop_ids_and_limits(big, references):
    """Stops right after a stop id, even in the middle of a round's accepted tokens, and never
    emits more than max_new_tokens."""
    contract = tiny_contract(draft_vocab_size=256)
    drafter = cheat_drafter(big, contract)
    prompt, _ = prompt_plan(0)
    ref = references[0][0, prompt.shape[1]:].tolist()
    for stop_at in (0, 5, 17, 60):
        stop = ref[stop_at]
        expected = ref[: ref.index(stop) + 1]
        for options in ({"draft_tokens": 6}, {"tree": (6, 2, 10)}):
            drafter.arm(int(prompt[0, 0]), greedy_oracle(references[0]), hit=1.0, seed=0)
            out, stats = generate(big, drafter, prompt, max_new_tokens=200, stop_ids=[stop], **options)
            assert out[0, prompt.shape[1]:].tolist() == expected
            assert stats["new_tokens"] == len(expected)
    for limit in (1, 2, 7):
        drafter.arm(int(prompt[0, 0]), greedy_oracle(references[0]), hit=1.0, seed=0)
        out, stats = generate(big, drafter, prompt, max_new_tokens=limit, draft_tokens=6)
        assert out[0, prompt.shape[1]:].tolist() == ref[:limit]
        assert stats["tau"] == (limit - 1.0 if limit > 1 else None)  # one round, every draft accepted


def test_greedy_matches_target_qwen3(tmp_path):
    """Qwen3 (q/k norms) through the same tree path: still the target's own greedy output."""
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**GREEDY_TARGET, initializer_range=0.3, tie_word_embeddings=False,
                                         bos_token_id=None, eos_token_id=None, pad_token_id=None))
    model.save_pretrained(tmp_path)
    target = Target.load(tmp_path)
    drafter = cheat_drafter(target, tiny_contract(draft_vocab_size=256))
    for i in range(2, 6):
        prompt, new = prompt_plan(i)
        ref = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=new, pad_token_id=0)
        drafter.arm(int(prompt[0, 0]), greedy_oracle(ref), hit=0.7, seed=i)
        out, _ = generate(target, drafter, prompt, max_new_tokens=new, tree=(4, 3, 10))
        assert out.tolist() == ref.tolist(), f"prompt {i}"


def test_a_longrope_target_is_decoded_within_its_original_length(tmp_path):
    """transformers rotates a longrope target (Phi-3) with its long factors once a forward's positions pass the
    original length: a verify reaching past it rotated a round otherwise than one-token steps would, and the
    answer depended on the draft. eyas decodes it within that length, where every forward agrees with
    transformers' generate, and refuses a longer answer in one line."""
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
            "long_factor": [float(4 + i) for i in range(8)], "original_max_position_embeddings": 32}
    target = build_target(tmp_path, 7, **{**GREEDY_TARGET, "max_position_embeddings": 128}, rope_parameters=rope)
    assert target.context == Chat.load(tmp_path).context == 32
    drafter = cheat_drafter(target, tiny_contract(draft_vocab_size=256))
    for i in range(3):
        prompt = torch.randint(0, 256, (1, 20 + i), generator=torch.Generator().manual_seed(i))
        new = 32 - prompt.shape[1]
        ref = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=new, pad_token_id=0)
        drafter.arm(int(prompt[0, 0]), greedy_oracle(ref), hit=0.7, seed=i)
        for shape in ({"draft_tokens": 6}, {"tree": (6, 3, 12)}):
            out, _ = generate(target, drafter, prompt, max_new_tokens=new, **shape)
            assert out.tolist() == ref.tolist(), (i, shape)
        with pytest.raises(EyasError, match=r"context is 32 \(longrope: its original length\)"):
            generate(target, drafter, prompt, max_new_tokens=new + 1, draft_tokens=6)
    # as config.json files write it: Phi-3's rope_scaling `type` and a top-level original length
    phi3 = {"max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}}
    assert longrope_length(phi3) == decode_context(phi3) == 4096
    assert decode_context({"max_position_embeddings": 512, "rope_scaling": {"rope_type": "llama3"}}) == 512


@pytest.mark.parametrize("family", ["phi3", "mistral", "qwen2", "gpt_oss"])
def test_a_sliding_window_target_is_decoded_past_its_window(tmp_path, family):
    """transformers gives a sliding-window target (Phi-3's published configs: 2047; Mistral v0.1: 4096;
    gpt-oss: 128, every other layer) a cache that drops keys past the window, which eyas cannot trim: every
    such target was refused, then bounded by its window. eyas decodes it with a full cache and the window in
    its masks (transformers' own for chains, eyas's for trees: one per layer kind where they alternate), token
    for token as transformers' generate with its own sliding cache, answers four windows long."""
    import transformers

    window, config = 8, {**GREEDY_TARGET, "max_position_embeddings": 128}
    extra = {"phi3": {"sliding_window": window}, "mistral": {"sliding_window": window},
             "qwen2": {"sliding_window": window, "use_sliding_window": True, "max_window_layers": 3},
             "gpt_oss": {"sliding_window": window, "num_local_experts": 4, "num_experts_per_tok": 2,
                         "rope_scaling": None}}[family]
    cls = {"phi3": "Phi3", "mistral": "Mistral", "qwen2": "Qwen2", "gpt_oss": "GptOss"}[family]
    torch.manual_seed(0)
    getattr(transformers, f"{cls}ForCausalLM")(getattr(transformers, f"{cls}Config")(
        **config, **extra, initializer_range=0.3, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)).save_pretrained(tmp_path)
    target = Target.load(tmp_path)
    assert sliding_window(target.config.to_dict()) == window and target.context == 128
    drafter = cheat_drafter(target, tiny_contract(draft_vocab_size=256))
    for i in range(2):
        prompt = torch.randint(0, 256, (1, 5 + 7 * i), generator=torch.Generator().manual_seed(i))
        new = 4 * window
        ref = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=new, pad_token_id=0)
        drafter.arm(int(prompt[0, 0]), greedy_oracle(ref), hit=0.7, seed=i)
        for shape in ({"draft_tokens": 6}, {"tree": (6, 3, 12)}, {"draft_tokens": 0}):
            out, _ = generate(target, None if shape == {"draft_tokens": 0} else drafter, prompt, max_new_tokens=new,
                              **({} if shape == {"draft_tokens": 0} else shape))
            assert out.tolist() == ref.tolist(), (i, shape)
    assert sliding_window({"sliding_window": 4096}) == 4096  # Mistral v0.1's config.json: every layer
    assert sliding_window({"sliding_window": 32768, "use_sliding_window": False}) is None  # Qwen2's, switched off
    assert sliding_window({"sliding_window": 64, "layer_types": ["full_attention"] * 2}) is None
    assert sliding_window({"sliding_window": 64, "layer_types": ["linear_attention", "sliding_attention"]}) is None


def paths_to(tree: DraftTree, i: int) -> list[int]:
    """The nodes from the root to node i, root included."""
    return paths_to(tree, tree.parents[i]) + [i] if i else [0]


def test_a_llama4_target_is_decoded_past_its_chunks_and_scale_floors(tmp_path, monkeypatch):
    """Llama 4's chunked-attention layers got a cache eyas cannot trim, and generate refused the target. It is
    decoded as a sliding-window target is: a full cache, the chunk in the masks (transformers' for chains, eyas's
    for trees). Its NoPE layers scale queries by a step function of positions transformers counts from the cache
    length, so a tree straddling a step would be scaled for other positions than its nodes': such a round
    verifies the nodes before the step. Token for token as transformers' generate, with chunks of 8 and floors
    of 16 (8192 both in the published configs), answers crossing several of each."""
    import transformers

    verify_mod = sys.modules["eyas.decode.verify"]  # eyas.decode.verify is also the name of a function
    config = transformers.Llama4TextConfig(
        **GREEDY_TARGET, intermediate_size_mlp=128, attention_chunk_size=8, floor_scale=16, attn_scale=4.0,
        num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=2, initializer_range=0.3,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    transformers.Llama4ForCausalLM(config).save_pretrained(tmp_path)
    target = Target.load(tmp_path)
    assert (target.chunk, target.scale_floor) == (8, 16)
    drafter = cheat_drafter(target, tiny_contract(draft_vocab_size=256))
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(0))
    ref = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=40,
                                pad_token_id=0)
    shapes = ({"draft_tokens": 6}, {"tree": (6, 3, 12)}, {})
    for shape in shapes:
        drafter.arm(int(prompt[0, 0]), greedy_oracle(ref), hit=0.9, seed=0)
        out, _ = generate(target, drafter if shape else None, prompt, max_new_tokens=40, **shape)
        assert out.tolist() == ref.tolist(), shape
    with monkeypatch.context() as m:  # without the chunk in the tree masks
        plain = verify_mod.tree_attention_mask
        m.setattr(verify_mod, "tree_attention_mask", lambda *a, chunk=None, **k: plain(*a, **k))
        drafter.arm(int(prompt[0, 0]), greedy_oracle(ref), hit=0.9, seed=0)
        assert generate(target, drafter, prompt, max_new_tokens=40, tree=(6, 3, 12))[0].tolist() != ref.tolist()
    # a tree straddling the floor at 16: every node kept is scored as a forward over its own path scores it
    tokens = ref[0, :20]
    tree = DraftTree(tokens[12:20], [-1, 0, 0, 1, 1, 2, 3, 4], [0, 1, 1, 2, 2, 2, 3, 3])  # node 3: at 14, scaled for 15
    assert len(verify_mod.placed_nodes(target, tree, 12).parents) == 3 and verify_mod.placed_nodes(
        target, tree, 0) is tree  # far from the floor: whole
    for placed in (verify_mod.placed_nodes(target, tree, 12), tree):
        cache = verify_mod.prefill(target, tokens[None, :12], [], 64).past_key_values
        logits = verify_mod.verify(target, placed, cache, 12, []).logits[0]
        paths = [paths_to(placed, i) for i in range(len(placed.parents))]
        own = [target.model(torch.cat([tokens[:12], placed.tokens[p]])[None]).logits[0, -1] for p in paths]
        same = [torch.allclose(logits[i], own[i], atol=1e-4) for i in range(len(own))]
        assert all(same) == (placed is not tree), same


def test_a_tree_wider_than_its_budget_drafts_the_budget_s_width():
    """A node's children past the budget's count are never kept (its better siblings fill the budget
    first), so top_k is capped at the budget: --tree 3,49151,16 drafted 49151 x 49151 candidates a level and
    ran out of memory for the 16 nodes it verifies."""
    drafter = object.__new__(Drafter)
    assert loop._draft_plan(drafter, None, (3, 49151, 16)) == (3, (3, 16, 16))
    assert loop._draft_plan(drafter, None, (5, 4, 16)) == (5, (5, 4, 16))


@pytest.mark.slow
def test_embedded_default_greedy_with_stop_ids():
    """SmolLM2-135M-Instruct with chat prompts: chain and tree decoding equal HF generate, which
    stops at the generation config's eos (first prompt, ~13 tokens) or at max_new_tokens = 40 (second);
    eyas gets the same eos as stop_ids."""
    target = Target.load()
    eos = target.model.generation_config.eos_token_id
    contract = tiny_contract(
        hidden_size=target.hidden_size, target_hidden_size=target.hidden_size, vocab_size=target.vocab_size,
        draft_vocab_size=target.vocab_size, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
        intermediate_size=256, capture_layers=(2, 15, 27),
        verifier=Verifier(num_hidden_layers=30, hidden_size=target.hidden_size, vocab_size=target.vocab_size),
    )
    drafter = cheat_drafter(target, contract)
    for question in ("Name three primary colors.", "Explain in two sentences why the sky is blue."):
        chat = [{"role": "user", "content": question}]
        prompt = target.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True,
                                                      return_tensors="pt")["input_ids"]
        ref = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=40)
        for options in ({"draft_tokens": 5}, {"tree": (5, 4, 16)}):
            drafter.arm(int(prompt[0, 0]), greedy_oracle(ref), hit=0.7, seed=0)
            out, stats = generate(target, drafter, prompt, max_new_tokens=40, stop_ids=[eos], **options)
            assert out.tolist() == ref.tolist(), (question, options)
            assert stats["tau"] > 1.5


# --- the tree pieces: masks, KV gathering, the EAGLE-2 tree --------------------------------------


def test_tree_verify_and_kv_gather_are_exact(big):
    """Verifying a tree in one forward gives every node the logits of its own path, and keeping an
    accepted branch leaves the cache a plain forward over that branch would have built."""
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 256, (1, 9), generator=g)
    #         root  1  2  3  4  5  6  7
    parents = [-1, 0, 0, 1, 1, 2, 4, 6]
    depths = [0, 1, 1, 2, 2, 2, 3, 4]
    tokens = torch.randint(0, 256, (len(parents),), generator=g)
    tree = DraftTree(tokens, parents, depths)
    prefill = big.forward(prompt, (1, 3))
    cache, n = prefill.past_key_values, prompt.shape[1]
    out = verify(big, tree, cache, n, (1, 3))
    for node in range(len(parents)):
        path = [node]
        while parents[path[-1]] > 0:
            path.append(parents[path[-1]])
        nodes = [0] + path[::-1] if node else [0]
        seq = torch.cat([prompt, tokens[nodes][None]], dim=1)
        full = big.forward(seq, (1, 3))
        torch.testing.assert_close(out.logits[0, node], full.logits[0, -1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.features[0, node], full.features[0, -1], atol=1e-4, rtol=1e-4)
    keep_accepted_kv(cache, n, [0, 2, 5])  # a branch that is not a prefix of the node order
    seq = torch.cat([prompt, tokens[[0, 2, 5]][None]], dim=1)
    plain = big.forward(seq, ()).past_key_values
    for ours, ref in zip(cache.layers, plain.layers, strict=True):
        torch.testing.assert_close(ours.keys, ref.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values, ref.values, atol=1e-5, rtol=1e-5)
    nxt = torch.tensor([[11]])
    after = big.forward(nxt, (), past_key_values=cache, position_ids=torch.tensor([[n + 3]]))
    torch.testing.assert_close(after.logits[0, -1], big.forward(torch.cat([seq, nxt], 1), ()).logits[0, -1],
                               atol=1e-4, rtol=1e-4)


def test_propose_tree_shape(big):
    """The EAGLE-2 tree keeps `budget` nodes, parents first, each node one deeper than its parent;
    with top_k = 1 it is a chain."""
    contract = tiny_contract()
    drafter = random_drafter(big, contract)
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(3))
    features = big.forward(prompt, contract.capture_layers).features
    for depth, top_k, budget in [(4, 3, 10), (3, 4, 100), (5, 1, 5), (1, 5, 3)]:
        cache = DraftCache(drafter, 1, 64)
        logits, hidden = draft_step0(drafter, cache, features, torch.cat([prompt[:, 1:], prompt[:, :1]], 1), 6)
        tree = propose_tree(drafter, cache, logits, hidden, prompt[0, :1], 6, depth, top_k, budget)
        candidates = top_k + (depth - 1) * top_k * top_k
        assert len(tree.parents) == 1 + min(budget, candidates)
        assert all(0 <= p < i and tree.depths[i] == tree.depths[p] + 1 for i, p in enumerate(tree.parents) if i)
        assert max(tree.depths) <= depth
        assert bool(drafter.t2d[tree.tokens[1:]].all())  # draft ids were mapped to target ids
        for i in range(len(tree.parents)):
            kids = tree.tokens[tree.children(i)].tolist()
            assert len(kids) == len(set(kids)) <= top_k
        assert tree.is_chain == (top_k == 1 or depth == 1 and budget == 1)


def test_tree_candidates_break_ties_as_the_chain_and_eval_do(big):
    """Tied draft scores (common in bf16): the tree's level-1 candidates are the lower ids, as the chain's argmax
    and eval's tree (eyas.acceptance.top_ids) take them; `topk` took the highest of four tied ids first."""
    contract = tiny_contract()
    drafter = random_drafter(big, contract)
    logits = torch.full((1, 1, contract.draft_vocab_size), -5.0)
    logits[0, 0, [3, 7, 11, 15]] = 2.0
    tree = propose_tree(drafter, DraftCache(drafter, 1, 64), logits, torch.zeros(1, 1, contract.hidden_size),
                        torch.tensor([1]), 6, 1, 2, 2)
    assert tree.tokens[1:].tolist() == drafter.to_target_ids(torch.tensor([3, 7])).tolist()


def test_a_one_wide_tree_drafts_the_chain_within_a_sliding_window(big):
    """A tree of top_k 1 is a chain: with a draft that attends over its last 3 positions, the tree's
    ancestor mask keeps the same window as the chain's causal one (prompt 12 tokens, so the window
    cuts the context; depth 5, so it cuts the tree's own ancestors too)."""
    contract = tiny_contract(sliding_window=3)
    drafter = random_drafter(big, contract)
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(5))
    features = big.forward(prompt, contract.capture_layers).features
    nxt = torch.cat([prompt[:, 1:], prompt[:, :1]], 1)
    drafts = []
    vocab_map, forward, seen = drafter.t2d.nonzero().squeeze(1), drafter.forward, []

    def spy(*args, **kwargs):  # every draft step's logits, not just its argmax
        out = forward(*args, **kwargs)
        seen[-1].append(out[0][0, -1])
        return out

    drafter.forward = spy
    for propose in (lambda *a: propose_tree(*a, 5, 1, 5), lambda *a: propose_chain(*a, 5, Sampling(), vocab_map, 256)):
        cache, _ = DraftCache(drafter, 1, 64), seen.append([])
        logits, hidden = draft_step0(drafter, cache, features, nxt, 12)
        drafts.append(propose(drafter, cache, logits, hidden, prompt[0, :1], 12).tokens.tolist())
    assert drafts[0] == drafts[1] and len(seen[0]) == len(seen[1]) == 5  # step 0, then 4 reads
    torch.testing.assert_close(torch.stack(seen[0]), torch.stack(seen[1]), rtol=1e-5, atol=1e-5)


# --- sampling: exactly the target distribution ---------------------------------------------------

N_SAMPLES = 400
N_GENERATED = 4  # x_1 from the prefill, x_2..x_4 from speculative rounds
SAMPLING_PROMPT = torch.tensor([[3, 1, 4, 1, 5]])


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Target:
    # per-token entropy ~1.3 nats of the 2.1 possible: tokens are neither uniform nor fixed
    return build_target(tmp_path_factory.mktemp("sampling-target"), 1, **SAMPLING_TARGET)


def small_contract():
    """A draft of the sampling target that predicts 6 of its 8 tokens (so q is 0 on two)."""
    return tiny_contract(
        vocab_size=8, draft_vocab_size=6, target_hidden_size=32, capture_layers=(1, 2, 4),
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        verifier=Verifier(num_hidden_layers=4, hidden_size=32, vocab_size=8),
    )


def chi_square_pvalue(samples: list[tuple], target: Target, s: Sampling, prompt: torch.Tensor = SAMPLING_PROMPT) -> float:
    """Pearson's test of sampled sequences (continuations of `prompt`, all of one length) against the
    target's sampling distribution.

    The joint of the generated tokens has too many cells for a few hundred samples, so the test runs
    down the prefix tree instead: for every prefix x_1..x_{j-1} that was sampled, the counts of x_j
    against m * p(x_j | prompt, prefix) (exact, from one target forward). Given the prefix counts
    these are independent multinomials, so the statistics and degrees of freedom add up. Cells that
    expect < 5 are pooled.
    """
    statistic, dof = 0.0, 0
    for j in range(len(samples[0])):
        groups = Counter(seq[:j] for seq in samples)
        for prefix, m in groups.items():
            counts = Counter(seq[j] for seq in samples if seq[:j] == prefix)
            with torch.no_grad():
                seq = torch.cat([prompt, torch.tensor([prefix], dtype=torch.long)], dim=1)
                p = warp_probs(target.model(seq).logits[0, -1], s).double()
            impossible = [x for x in counts if p[x] == 0]
            assert not impossible, f"sampled token(s) {impossible} of probability 0 after {prefix}"
            expected = m * p
            big = [x for x in range(len(p)) if expected[x] >= 5]
            observed = [counts[x] for x in big] + [m - sum(counts[x] for x in big)]
            wanted = [float(expected[x]) for x in big] + [m - float(expected[big].sum())]
            if wanted[-1] < 5 and big:  # fold a thin rest into the last cell; both sides still sum to m
                observed[-2:], wanted[-2:] = [observed[-2] + observed[-1]], [wanted[-2] + wanted[-1]]
            if len(observed) > 1:
                statistic += float(chisquare(observed, wanted).statistic)
                dof += len(observed) - 1
    assert dof > 10, "too few testable cells: the check would have no power"
    return float(chi2.sf(statistic, dof))


def sample_runs(target: Target, drafter, options: dict, s: Sampling, oracle=None) -> list[tuple]:
    runs = []
    for seed in range(N_SAMPLES):
        if oracle is not None:
            drafter.arm(int(SAMPLING_PROMPT[0, 0]), oracle, hit=0.7, seed=seed)
        out, _ = generate(target, drafter, SAMPLING_PROMPT, max_new_tokens=N_GENERATED, seed=seed,
                          temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, **options)
        runs.append(tuple(out[0, SAMPLING_PROMPT.shape[1]:].tolist()))
    return runs


def target_logits_oracle(target: Target):
    """The target's own next-token logits after a prefix (memoised): a cheat with q close to p."""
    memo: dict[tuple, torch.Tensor] = {}

    def oracle(prefix: list[int]) -> torch.Tensor:
        key = tuple(prefix)
        if key not in memo:
            with torch.no_grad():
                memo[key] = target.model(torch.tensor([prefix])).logits[0, -1]
        return memo[key]

    return oracle


SAMPLING_CASES = {  # name: (drafter kind, options, sampling)
    "target-only": (None, {}, Sampling(1.0)),
    "chain-random": ("random", {"draft_tokens": 3}, Sampling(1.0)),
    "chain-cheat-warped": ("cheat", {"draft_tokens": 3}, Sampling(0.8, top_p=0.9, top_k=5)),
    "tree-cheat": ("cheat", {"tree": (3, 3, 6)}, Sampling(1.0)),
}


@pytest.mark.parametrize("case", sorted(SAMPLING_CASES))
def test_sampling_is_lossless(small, case):
    kind, options, s = SAMPLING_CASES[case]
    drafter = None
    if kind == "random":
        drafter = random_drafter(small, small_contract(), seed=2)
    elif kind == "cheat":
        drafter = cheat_drafter(small, small_contract(), seed=2)
    oracle = target_logits_oracle(small) if kind == "cheat" else None
    samples = sample_runs(small, drafter, options, s, oracle)
    p = chi_square_pvalue(samples, small, s)
    assert p > 0.001, f"{case}: sampled sequences do not follow the target distribution (p = {p:.2g})"


def test_sampling_check_detects_a_biased_sampler(small, monkeypatch):
    """Negative control: the classic bug (after a rejection, draw from p instead of the residual
    max(p - q, 0)) over-samples the drafted tokens, and the same check catches it."""
    real = loop.accept_chain_sampling

    def biased(tree, p, s):
        path, _ = real(tree, p, s)
        return path, draw(p[len(path)], s)

    monkeypatch.setattr(loop, "accept_chain_sampling", biased)
    drafter = random_drafter(small, small_contract(), seed=2)
    s = Sampling(1.0)
    samples = sample_runs(small, drafter, {"draft_tokens": 3}, s)
    p = chi_square_pvalue(samples, small, s)
    assert p < 0.001, f"the chi-square check missed a biased sampler (p = {p:.2g})"


def test_seed_reproducible_and_draws_vary(small):
    drafter = random_drafter(small, small_contract(), seed=2)
    runs = [generate(small, drafter, SAMPLING_PROMPT, max_new_tokens=12, seed=seed, temperature=1.0,
                     tree=(3, 2, 4))[0].tolist() for seed in (5, 5, 6, 7, 8)]
    assert runs[0] == runs[1]
    assert len({tuple(r[0]) for r in runs}) > 2


def test_warp_matches_hugging_face():
    """Temperature, top-k and top-p as Hugging Face generate applies them (in that order)."""
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 3
    for t, k, p in [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.8), (0.9, 20, 0.5), (1.0, 1, 0.3)]:
        ref = TemperatureLogitsWarper(t)(None, logits.clone())
        if k:
            ref = TopKLogitsWarper(k)(None, ref)
        if p < 1.0:
            ref = TopPLogitsWarper(p)(None, ref)
        ours = warp_probs(logits, Sampling(t, top_p=p, top_k=k))
        torch.testing.assert_close(ours, ref.softmax(-1))


@pytest.mark.parametrize("t, p", [(1e-40, 1.0), (1e-300, 1.0), (5e-324, 0.9), (1.0, 1e-300), (1e-40, 1e-300)])
def test_warp_extreme_settings_give_a_distribution(t, p):
    """A temperature so small the quotient overflows is its limit (argmax, ties shared), and a
    top_p below fp32's range still keeps the likeliest token: a distribution multinomial accepts."""
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.5, 0.1, 0.2, 0.3], [-7.0, -9.0, -8.0, -7.5]])
    probs = warp_probs(logits, Sampling(t, top_p=p))
    assert probs.isfinite().all()
    one_hot = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    want = torch.tensor([[0.0, 0.5, 0.5, 0.0], *one_hot[1:]]) if p > 0.5 else one_hot  # top-p keeps one tie
    torch.testing.assert_close(probs, want)
    torch.multinomial(probs, 1)


# --- refusals before any compute ----------------------------------------------------------------


def test_refusals(big, small, monkeypatch):
    """Bad requests and drafts that do not fit the target fail with EyasError before any forward."""
    calls = []
    monkeypatch.setattr(big, "forward", lambda *a, **k: calls.append(a))
    drafter = random_drafter(big, tiny_contract())
    prompt = torch.zeros(1, 5, dtype=torch.long)
    cases = [
        (EyasError, "batch size 1", dict(input_ids=torch.zeros(2, 5, dtype=torch.long), max_new_tokens=4)),
        (EyasError, "context is 512", dict(input_ids=torch.zeros(1, 500, dtype=torch.long), max_new_tokens=13)),
        (EyasError, "both draft_tokens and tree",
         dict(input_ids=prompt, max_new_tokens=4, draft_tokens=2, tree=(2, 2, 2))),
        (EyasError, "tree 2,0,2: expected", dict(input_ids=prompt, max_new_tokens=4, tree=(2, 0, 2))),
        (EyasError, "max_new_tokens=0", dict(input_ids=prompt, max_new_tokens=0)),
        (EyasError, "top_p", dict(input_ids=prompt, max_new_tokens=4, temperature=1.0, top_p=0.0)),
        (EyasError, "temperature=nan", dict(input_ids=prompt, max_new_tokens=4, temperature=float("nan"))),
    ]
    for error, text, kwargs in cases:
        with pytest.raises(error, match=text):
            generate(big, drafter, **kwargs)
    # a draft for another target: hidden 64 / vocab 256 against hidden 32 / vocab 8
    with pytest.raises(ContractError, match="does not fit"):
        generate(small, drafter, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=4)
    deep = random_drafter(big, tiny_contract(capture_layers=(1, 3, 7)))  # the target has 6 layers
    with pytest.raises(ContractError, match="outside the target"):
        generate(big, deep, prompt, max_new_tokens=4)
    assert not calls, "a refused request must not reach the target"
    monkeypatch.undo()
    # the longest prompt that fits runs
    out, _ = generate(big, None, torch.zeros(1, 500, dtype=torch.long), max_new_tokens=12)
    assert out.shape == (1, 512)
