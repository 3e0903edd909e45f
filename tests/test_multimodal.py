"""Multimodal targets run whole, on text: Gemma 3, Mistral 3, Qwen2.5-VL, LLaVA, Idefics3, SmolVLM, Llama 4.

Their checkpoints hold a vision tower beside the language model, under a `text_config`; eyas loads the class
the weights were saved from and runs its language model alone (`eyas.target._text_decoder`). Each was
refused or crashed before: a traceback reading `num_hidden_layers` from the outer config (Gemma 3, LLaVA),
no causal-LM class at all (Mistral 3, Qwen2.5-VL), or Llama 4's router (an nn.Linear subclass returning two
tensors) replaced by a packed linear during capture.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from conftest import tiny_contract
from test_data import save_tiny_target
from test_decode import cheat_drafter, greedy_oracle

from eyas.cli import main
from eyas.decode import generate
from eyas.errors import FormatError
from eyas.target import Target
from eyas.target_ref import TargetRef

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=False,
            eos_token_id=2, pad_token_id=0, bos_token_id=None)
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)
LAYERS = (1, 2, 4)  # 4: the input of the final norm


def _config(family: str):
    """A tiny multimodal config of `family`, its language model shaped as TEXT."""
    if family == "gemma3":  # tied by its outer config (the class default), whatever text_config says
        return transformers.Gemma3Config(
            text_config={**TEXT, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 2,
                         "final_logit_softcapping": None}, vision_config=VISION, mm_tokens_per_image=4,
            image_token_index=47)
    if family == "mistral3":
        return transformers.Mistral3Config(text_config={**TEXT, "model_type": "mistral", "sliding_window": None},
                                           vision_config={**VISION, "model_type": "pixtral", "head_dim": 8},
                                           image_token_index=47)
    if family == "qwen2_5_vl":  # rotary over three position sections (text: all three alike)
        return transformers.Qwen2_5_VLConfig(
            text_config={**TEXT, "model_type": "qwen2_5_vl_text",
                         "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}},
            vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                           "out_hidden_size": 32, "patch_size": 14, "window_size": 28, "fullatt_block_indexes": [0]},
            image_token_id=47, video_token_id=46, vision_start_token_id=45, tie_word_embeddings=False)
    if family == "llava":  # a Llama inside: the lean forward runs it
        return transformers.LlavaConfig(
            text_config={**TEXT, "model_type": "llama"}, image_token_index=47,
            vision_config={**VISION, "model_type": "clip_vision_model", "projection_dim": 16})
    if family in ("idefics3", "smol_vlm"):  # the language model under `model.text_model`
        name = "Idefics3Config" if family == "idefics3" else "SmolVLMConfig"
        return getattr(transformers, name)(text_config={**TEXT, "model_type": "llama"}, vision_config=VISION,
                                           image_token_id=47, scale_factor=1)
    if family == "mllama":  # cross-attention layers among the decoder's: refused
        return transformers.MllamaConfig(
            text_config={**TEXT, "bos_token_id": 1, "cross_attention_layers": [1], "rope_scaling": None},
            vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                           "num_global_layers": 1, "attention_heads": 2, "image_size": 28, "patch_size": 14,
                           "vision_output_dim": 32, "intermediate_layers_indices": [0], "max_num_tiles": 1,
                           "supported_aspect_ratios": [[1, 1]]})
    return transformers.Llama4Config(  # MoE layers routed by an nn.Linear subclass; chunked attention
        text_config={**TEXT, "num_local_experts": 2, "intermediate_size_mlp": 64, "attention_chunk_size": 16},
        vision_config={**VISION, "vision_output_dim": 16, "projector_input_dim": 16, "projector_output_dim": 16},
        image_token_index=47)


CLASSES = {"gemma3": "Gemma3", "mistral3": "Mistral3", "qwen2_5_vl": "Qwen2_5_VL", "llava": "Llava", "llama4": "Llama4",
           "idefics3": "Idefics3", "smol_vlm": "SmolVLM"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each family saved as transformers writes it, with the tiny target's chat tokenizer beside it."""
    root = tmp_path_factory.mktemp("multimodal")
    chat = save_tiny_target(root / "chat")
    made = {}
    for family, name in {**CLASSES, "mllama": "Mllama"}.items():
        folder = made[family] = root / family
        folder.mkdir()
        for f in chat.iterdir():
            if f.name != "model.safetensors":
                (folder / f.name).write_bytes(f.read_bytes())
        torch.manual_seed(0)
        getattr(transformers, f"{name}ForConditionalGeneration")(_config(family)).save_pretrained(folder)
    return made


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_a_multimodal_target_captures_what_its_own_forward_computes(folders, family):
    """The features at the capture layers and the logits are the whole model's own (its forward on text, hidden
    states and all), and the head read alone (eval --data, doctor --features) gives the same verdict."""
    target = Target.load(folders[family])
    assert type(target.model).__name__ == f"{CLASSES[family]}ForConditionalGeneration"
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (4, 32, 48)
    ids = torch.randint(3, 44, (1, 11), generator=torch.Generator().manual_seed(0))
    out = target.forward(ids, LAYERS)
    with torch.no_grad():
        own = target.model(input_ids=ids, output_hidden_states=True)
    states = own.hidden_states  # [i]: the input of layer i (the last is final-normed)
    assert torch.allclose(out.features[..., :64], torch.cat([states[1], states[2]], -1), atol=1e-6)
    assert torch.allclose(out.logits, own.logits, atol=1e-5)
    head = TargetRef.resolve(folders[family]).head()  # from the final norm's input, captured at layer 4
    assert torch.allclose(head.normalize(out.features[..., 64:]) @ head.lm_head.float().T, own.logits, atol=1e-4)


@pytest.mark.parametrize("family", ["gemma3", "mistral3", "qwen2_5_vl", "llava", "smol_vlm", "llama4"])
def test_a_multimodal_target_is_decoded_token_for_token(folders, family):
    """Chains, a tree and the target alone, as the whole model's own generate on text; Gemma 3's answers run
    past its sliding window (8) through alternating layers, Llama 4's past its attention chunks (16)."""
    target = Target.load(folders[family])
    drafter = cheat_drafter(target, tiny_contract(vocab_size=48, draft_vocab_size=48, hidden_size=32, head_dim=8,
                                                  intermediate_size=64, target_hidden_size=32, capture_layers=LAYERS))
    for i in range(2):
        prompt = torch.randint(3, 44, (1, 5 + 7 * i), generator=torch.Generator().manual_seed(i))
        ref = target.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=32, pad_token_id=0, eos_token_id=None)
        drafter.arm(int(prompt[0, 0]), greedy_oracle(ref), hit=0.7, seed=i)
        for shape in ({"draft_tokens": 6}, {"tree": (6, 3, 12)}, {}):
            out, _ = generate(target, drafter if shape else None, prompt, max_new_tokens=32, **shape)
            assert out.tolist() == ref.tolist(), (i, shape)


def test_the_command_line_runs_a_multimodal_target_or_says_why_not(folders, tmp_path, capsys):
    """Mistral 3 has no causal-LM class: generate answers with it. Llama 4's chunked attention kept a cache eyas
    could not trim, and generate refused it: now it decodes, and captures."""
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(folders["mistral3"]), "--capture-layers", "1,2,4"]) == 0
    assert main(["generate", str(draft), "--target", str(folders["mistral3"]), "--prompt", "hello there",
                 "--max-new-tokens", "8", "--draft-tokens", "3"]) == 0
    capsys.readouterr()
    assert main(["init", str(tmp_path / "draft4"), "--target", str(folders["llama4"]), "--capture-layers", "1,2,4"]) == 0
    assert main(["generate", str(tmp_path / "draft4"), "--target", str(folders["llama4"]), "--prompt", "hello",
                 "--max-new-tokens", "8", "--tree", "3,2,4"]) == 0
    assert main(["generate", "--target", str(folders["mllama"]), "--prompt", "hello", "--max-new-tokens", "8"]) == 2
    assert "has cross-attention layers [1] (model_type 'mllama_text_model'), skipped on text" in capsys.readouterr().err
    with pytest.raises(FormatError, match="skipped on text: eyas captures and decodes decoder-only language models"):
        Target.load(folders["mllama"])  # the library's own check, after the load
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nthe cat sat\n")
    assert main(["capture", "--target", str(folders["llama4"]), "--prompts", str(prompts), "--out",
                 str(tmp_path / "cap"), "--capture-layers", "1,2,4", "--max-new-tokens", "8"]) == 0
