"""The target ("verifier") model: a local Hugging Face causal LM, plus feature capture.

A target is a folder with a `config.json` and weights that `transformers` can load without running
code from the folder: eyas never passes `trust_remote_code`, so a model whose config needs `auto_map`
(custom modeling code) fails to load in transformers instead of executing that code. Nothing is ever
downloaded. A target is named once (`eyas.target_ref.TargetRef`: folder, config, device, dtype);
the embedded default is `eyas.embedded` (SmolLM2-135M-Instruct).

Capture convention (eyas.contract): index k is the residual stream ENTERING decoder layer k, so
index 0 is the embeddings and index N (N = number of layers) is the last layer's output BEFORE the
final norm. Hugging Face's `output_hidden_states[k]` is the same tensor for k < N, but in
transformers 5.x its LAST entry (index N) is the final-NORMED state (`capture_outputs` overwrites it
with `last_hidden_state`). `Target.forward` records the inputs of the decoder layers (and of the
final norm, for index N) with forward pre-hooks that exist only during the call; unlike
`output_hidden_states` this keeps no other states (keeping them all slows a long prefill).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eyas.contract import DraftContract, check_capture_layers
from eyas.embedded import DEFAULT_SPECS, EMBEDDED_DIR, EMBEDDED_NAME, cache_dir, embedded_default_dir
from eyas.devices import RUN_OVERHEAD, check_fits_memory, free_bytes, gib
from eyas.dtypes import short_name
from eyas.errors import ContractError, EyasError, FormatError
from eyas.logit_map import logit_map
from eyas.target_context import attention_chunk, decode_context, scale_floor, sliding_window
from eyas.target_ref import (
    TargetRef,
    cross_attention,
    load_target_embeddings,
    resolve_target,
    target_config,
    target_name,
    target_tensors,
)
from eyas.weights import weight_files

# The names callers import from eyas.target: a target's identity, config and tensors live in
# eyas.target_ref, the embedded default in eyas.embedded.
__all__ = ["DEFAULT_SPECS", "EMBEDDED_DIR", "EMBEDDED_NAME", "Chat", "Target", "TargetOutput", "TargetRef",
           "cache_dir", "check_fits", "embedded_default_dir", "load_target_embeddings", "resolve_target",
           "target_config", "target_name", "target_tensors"]

# --- the model ------------------------------------------------------------------------------


@dataclass
class TargetOutput:
    features: Tensor  # [B, T, A*H] states at capture_layers, concatenated in that order
    last_hidden: Tensor  # [B, T, H] after the final norm: what lm_head reads
    logits: Tensor | None  # [B, T, V], None when with_logits=False
    past_key_values: object  # the HF cache (DynamicCache), updated with these T positions


@dataclass(frozen=True)
class Chat:
    """What turns prompts into a target's chat ids: its tokenizer, name and context. Loaded in seconds where
    the weights take minutes (and `--dtype auto` times them first), so a prompt too long for the target is
    refused before either; a Target is one too (eyas.data.encode_prompts reads these three)."""

    tokenizer: Any
    name: str
    context: int | None

    @classmethod
    def load(cls, spec: str | Path | TargetRef | None = None) -> Chat:
        ref = TargetRef.resolve(spec, weights=False)  # no context: the model's class default, said later
        return cls(_tokenizer(ref), ref.name, decode_context(ref.text_config))


class Target:
    """A Hugging Face causal LM in eval mode, with one-forward feature capture."""

    def __init__(self, model, tokenizer, path: Path, name: str):
        self.model = model.eval()
        self.tokenizer = tokenizer  # None when the folder ships no tokenizer
        self.config = model.config.get_text_config(decoder=True)  # a multimodal target's: its language model's
        self.path = path
        self.name = name
        self.num_layers: int = self.config.num_hidden_layers
        self.hidden_size: int = self.config.hidden_size
        self.vocab_size: int = self.config.vocab_size
        self.decoder = _text_decoder(model)  # LlamaModel, Qwen3Model, ...: embed_tokens, layers, norm
        text = self.config.to_dict()
        self.window = sliding_window(text)  # decoded with a full cache, the window in the masks
        self.chunk = attention_chunk(text)  # Llama 4's chunked layers: as the window is
        self.scale_floor = scale_floor(text)  # Llama 4's NoPE query scale (eyas.decode.verify.placed_nodes)
        # what the class does to lm_head's output (Gemma 2's softcapping, Granite's and Cohere's scales)
        self.logit_map = logit_map(model.config.model_type, self.config, f"target {path}")
        crossed = cross_attention(text)
        if crossed:
            raise FormatError(f"target {path}: {crossed}", "use a decoder-only target (Llama 3.1 for Llama 3.2 "
                              "Vision's text)")
        if self.decoder is None:
            raise FormatError(
                f"target {path}: {type(model).__name__} has no decoder `layers` and final `norm`",
                "use a Llama-style decoder-only model (Llama, Qwen2/3, Mistral, ...)",
            )

    @property
    def context(self) -> int | None:
        """The longest sequence eyas decodes it in: max_position_embeddings, as transformers' config reads it
        (longrope targets: their original length, eyas.target_context.longrope_length says why)."""
        return decode_context(self.config.to_dict(), getattr(self.config, "max_position_embeddings", None))

    @property
    def device(self) -> torch.device:
        """Where its first weights are (a model spread over GPUs starts there): what a speed is measured on."""
        return next(self.model.parameters()).device

    @classmethod
    def load(cls, spec: str | Path | TargetRef | None = None, *, dtype: torch.dtype | None = None,
             device: str | torch.device | None = None) -> Target:
        """Load a target (a spec or a TargetRef) for inference: weights in `dtype` on `device`
        (default: the ref's, else fp32 on cpu).

        Refused before loading when the weights would not fit the device's free memory. `cuda`
        on a machine with several GPUs spreads a target that does not fit one over all of them
        (accelerate's `device_map="auto"`); `cuda:N` keeps it on GPU N.
        """
        ref = TargetRef.resolve(spec, device=device, dtype=dtype)
        tokenizer = _tokenizer(ref)  # first: seconds, where the weights take minutes
        placement = _placement(ref, device)
        model = _from_pretrained(ref, placement)
        if not placement and ref.device.type != "cpu":
            model.to(ref.device)
        return cls(model, tokenizer, ref.path, ref.name)

    @torch.no_grad()  # not inference_mode: features must stay usable as inputs to a trained drafter
    def forward(
        self,
        input_ids: Tensor,
        capture_layers: Iterable[int],
        *,
        past_key_values=None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        with_logits: bool = True,
    ) -> TargetOutput:
        """One target forward over `input_ids` [B, T] (a prefill, or T new tokens on a cache).

        `attention_mask` (2D padding mask, or a prepared 4D mask such as a tree mask) and
        `position_ids` go to the model unchanged; `past_key_values` is a transformers DynamicCache
        (None starts a new one) and comes back updated.
        """
        layers = tuple(int(k) for k in capture_layers)
        bad = [k for k in layers if not 0 <= k <= self.num_layers]
        if bad:
            raise ContractError(
                f"capture layers {bad} are outside 0..{self.num_layers} for target {self.name} "
                f"({self.num_layers} decoder layers)",
                "index k is the input of decoder layer k; the last valid index is the number of layers",
            )
        captured: dict[int, Tensor] = {}

        def recorder(k: int):
            def hook(module, args, kwargs):
                captured[k] = args[0] if args else kwargs["hidden_states"]

            return hook

        # index k < N: the input of decoder layer k; index N: the input of the final norm
        modules = {k: self.decoder.layers[k] if k < self.num_layers else self.decoder.norm for k in set(layers)}
        hooks = [m.register_forward_pre_hook(recorder(k), with_kwargs=True) for k, m in modules.items()]
        try:
            out = self.decoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=True,
            )
        finally:
            for h in hooks:
                h.remove()
        last = out.last_hidden_state  # [B, T, H], final-normed
        if layers:
            # A x [B, T, H] -> [B, T, A*H]; a target spread over GPUs captures each on its layer's GPU
            features = torch.cat([captured[k].to(last.device) for k in layers], dim=-1)
        else:
            features = last.new_empty(*last.shape[:2], 0)
        logits = self.logit_map(self.model.get_output_embeddings()(last)) if with_logits else None  # [B, T, V]
        return TargetOutput(features, last, logits, out.past_key_values)


def _text_decoder(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module holding embed_tokens, the decoder layers and the final norm: the base model (LlamaModel,
    Qwen3Model), or a multimodal target's language model (Gemma 3's and Mistral 3's `model.language_model`,
    Idefics3's `model.text_model`, Llama 4's `language_model.model`), which runs alone on text: eyas never feeds
    it images."""
    base, language = model.base_model, getattr(model, "language_model", None)
    for found in (base, getattr(base, "language_model", None), getattr(base, "text_model", None),
                  getattr(model, "model", None), language, getattr(language, "model", None)):
        if found is not None and hasattr(found, "layers") and hasattr(found, "norm"):
            return found
    return None


_TOKENIZERS: dict[str, tuple[tuple, Any]] = {}  # folder -> (its files' stamps, its tokenizer), the latest read


def _tokenizer(ref: TargetRef) -> Any:
    """The target's tokenizer (None where its folder ships none), read once per process while the folder's
    files stay as written: a verb that answers prompts reads it to refuse a long prompt before the weights
    load, then with the model (0.4 s each for SmolLM2's on a 2-core AVX2-only EPYC)."""
    if not ref.has_tokenizer():
        return None
    stamps, held = _stamps(ref.folder), _TOKENIZERS.get(str(ref.folder))
    if held is None or held[0] != stamps:  # one per folder: a rewritten one replaces what was read before
        held = _TOKENIZERS[str(ref.folder)] = (stamps, _read_tokenizer(ref))
    return held[1]


def _stamps(folder: Path) -> tuple:
    """(name, bytes, modification time) of each file in `folder` but its weights: what a tokenizer is built
    from (its own files, the config and chat template transformers read beside them)."""
    weights = set(weight_files(folder))
    files = [f for f in folder.iterdir() if f.name not in weights and f.is_file()]
    return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))


def _read_tokenizer(ref: TargetRef) -> Any:
    """The tokenizer of `ref`'s folder, refused in one line naming the folder where transformers cannot read
    it (a garbled tokenizer.json)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ref.path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError, ArithmeticError, RuntimeError) as e:
        why = (str(e).strip().splitlines() or [""])[0][:300]  # AutoTokenizer reads config.json too
        hint = ("install the library it names (a slow tokenizer needs sentencepiece or protobuf)"
                if isinstance(e, ImportError) else "check config.json, and copy the target's tokenizer files "
                "(tokenizer.json, tokenizer_config.json) again")
        raise FormatError(f"target {ref.path}: its tokenizer cannot be read, with its config.json "
                          f"({type(e).__name__}: {why})", hint) from e


def _from_pretrained(ref: TargetRef, placement: dict) -> torch.nn.Module:
    """transformers' model of `ref`, refused in one line naming the target where transformers cannot
    build it (an unknown model_type or rope type, heads that do not divide, a quantization it lacks,
    truncated weights) or would fill tensors the files lack with random ones: a target missing a layer
    still answers, fluently and wrongly, and every feature captured from it is wrong."""
    from safetensors import SafetensorError

    try:
        model, info = _auto_class(ref).from_pretrained(ref.path, dtype=ref.dtype, local_files_only=True,
                                                       output_loading_info=True, **placement)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError, ArithmeticError, RuntimeError,
            SafetensorError) as e:
        why = (str(e).strip().splitlines() or [""])[0][:300]
        raise FormatError(f"target {ref.path}: transformers cannot load it ({type(e).__name__}: {why})",
                          "check its config.json (model_type, heads, rope_scaling, quantization_config) and "
                          "weight files: eyas runs plain Hugging Face causal LMs") from e
    missing = sorted(info["missing_keys"])
    if missing:
        raise FormatError(f"target {ref.path}: its weight files lack {len(missing)} tensor(s) the config asks for "
                          f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); transformers would "
                          "fill them with random weights", "point --target at the complete model folder (every "
                          "shard the index names), with the config.json its weights were saved with")
    return model


def _auto_class(ref: TargetRef) -> type:
    """transformers' class for the target: a causal LM's, or for a multimodal target (a `vision_config` beside its
    `text_config`: Gemma 3, Mistral 3, Llama 4, Qwen2.5-VL) the image-text one, which its weights were saved
    from, so every tensor loads where it was written (no "unexpected" vision tower) and models with no causal-LM
    class (Mistral 3, Qwen2.5-VL) load at all. eyas runs its language model on text (`_text_decoder`)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as IMAGE_TEXT

    multimodal = "vision_config" in ref.config and ref.config.get("model_type") in IMAGE_TEXT
    return AutoModelForImageTextToText if multimodal else AutoModelForCausalLM


def _placement(ref: TargetRef, asked: str | torch.device | None) -> dict:
    """from_pretrained's placement, after refusing a target too large for where it would go.

    One device: nothing (the model is moved after loading). `cuda` without an index on a machine
    with several GPUs, for a target that does not fit the first: accelerate's `device_map="auto"`
    over all of them, refused when even their sum is too small.
    """
    gpus = torch.cuda.device_count() if ref.device.type == "cuda" else 0
    weights = ref.weight_bytes()
    what = f"target {ref.name} in {short_name(ref.dtype)}"
    if gpus < 2 or (asked is not None and ":" in str(asked)) or weights * RUN_OVERHEAD <= free_bytes(ref.device):
        check_fits_memory(weights, ref.device, what)
        return {}
    total = sum(free_bytes(torch.device("cuda", i)) for i in range(gpus))
    if weights * RUN_OVERHEAD > total:
        raise EyasError(f"{what} needs about {gib(weights * RUN_OVERHEAD)} but the {gpus} GPUs have "
                        f"{gib(total)} free together",
                        "use --dtype bf16, more GPUs, or evaluate from a feature cache (eyas eval --data)")
    return {"device_map": "auto"}


# --- does a draft fit this target? -------------------------------------------------------------


def check_fits(contract: DraftContract, target: Target | Mapping) -> None:
    """Raise ContractError (one line) when the draft cannot run on `target`, before any compute.

    `target` is a loaded Target or its config.json dict (`target_config(spec)`). Capture layers are
    checked only when the contract names them (callers substitute the engine default otherwise); a
    non-increasing order is refused too, since engines capture in layer order.
    """
    if isinstance(target, Target):
        name, layers, hidden, vocab = target.name, target.num_layers, target.hidden_size, target.vocab_size
    else:
        name = target.get("_name_or_path") or "target"
        layers, hidden, vocab = target["num_hidden_layers"], target["hidden_size"], target["vocab_size"]
    problems = []
    if contract.target_hidden_size != hidden:
        problems.append(f"draft target_hidden_size {contract.target_hidden_size} != target hidden size {hidden}")
    if contract.vocab_size != vocab:
        problems.append(f"draft vocab_size {contract.vocab_size} != target vocab {vocab}")
    if contract.capture_layers is not None:
        problems += check_capture_layers(contract, layers)
    if problems:
        raise ContractError(
            f"draft does not fit {name}: " + "; ".join(problems),
            "use the target the draft was trained on (see the draft's verifier config)",
        )
