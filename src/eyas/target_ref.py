"""A target named once, at the command's edge: its folder, config, device and dtype, and its tensors
read lazily by name.

Every verb used to resolve the same `--target` again and again (its name for manifests, its config
for the draft's fit, its embeddings, its lm_head). `TargetRef.resolve` does it once; everything
below takes the ref. It never builds the model (`eyas.target.Target.load(ref)` does): that is what
lets `eyas eval --data` judge a 671B target's draft from the target's final norm and `lm_head`
alone (`TargetRef.head`), reading two tensors from the one or two shards the index names for them.

Naming a target: nothing, "default", "smollm2" or the embedded default's cached folder itself is the
embedded default (`eyas.embedded.is_default`); a folder with config.json is that folder; the folder's
`config.json` stands for the folder; with `weights=False` (the verbs that only compare configs) a lone
config file under any name is enough.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from eyas.contract import language_config, target_size
from eyas.devices import parse_device
from eyas.embedded import EMBEDDED_NAME, embedded_default_dir, is_default
from eyas.errors import FormatError
from eyas.formats.schema import detect_format
from eyas.formats.validate import not_finite
from eyas.logit_map import FAMILIES, LogitMap, logit_map
from eyas.target_head import WEIGHTLESS_NORM, TargetHead, TargetNorm, refuse_head_bias
from eyas.weights import UNREADABLE, find_weights, read_tensors, weight_bytes, weight_files

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Target tensors by the names the drafter uses -> Hugging Face names on disk.
HF_NAMES = {
    "embed_tokens.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "norm.bias": "model.norm.bias",  # a LayerNorm's (StarCoder2's, StableLM's): absent from an RMSNorm's files
    "lm_head.weight": "lm_head.weight",  # absent from the files when tied to embed_tokens
}
# where a multimodal target's files hold those under its language model: Llama's prefix -> transformers' current
# layout (`model.language_model.norm.weight`, Llama 4, Gemma 3, Mistral 3 saved since 4.52), the older one, and
# Idefics3's and SmolVLM's `model.text_model.`
LANGUAGE_MODEL = {"model.": ("model.language_model.", "language_model.model.", "model.text_model."),
                  "": ("language_model.",)}


@dataclass(frozen=True)
class TargetRef:
    """A resolved `--target`: identity, config, where and in what precision it runs."""

    path: Path  # the model folder, or a lone config file (weights=False)
    name: str  # the identity recorded for it: the hub id of the default, else the absolute path
    config: dict
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32
    read: list[str] = field(default_factory=list, compare=False, repr=False)  # tensors read, in order
    # tensors read and still in use somewhere (a tied lm_head is the embeddings the draft already got):
    # asked again, they are not read again; held weakly, so the ref keeps nothing alive
    _alive: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary, compare=False,
                                                repr=False)
    # the final norm once read, held (H numbers): the digest reads it first and the head again after
    _norm: dict = field(default_factory=dict, compare=False, repr=False)
    # the weights' tensor names once listed (every header of a sharded target, or its index): asked by the
    # preflight's family and completeness checks and by the tie rule, read once
    _names: dict = field(default_factory=dict, compare=False, repr=False)
    # config.json as transformers' class reads it, once: asked by the tie rule at every lm_head name and the preflight
    _auto: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def resolve(cls, spec: str | Path | TargetRef | None = None, *, weights: bool = True,
                needed_by: str = "this command", device: str | torch.device | None = None,
                dtype: torch.dtype | None = None) -> TargetRef:
        """The one rule for every `--target` and every library `target=` (see the module docstring).

        A TargetRef passes through (re-placed when `device`/`dtype` are given). With `weights`, a
        lone config is refused in one line naming `needed_by`.
        """
        if isinstance(spec, TargetRef):
            if device is None and dtype is None:
                return spec
            return cls(spec.path, spec.name, spec.config, parse_device(device or spec.device),
                       dtype or spec.dtype)
        path = _resolve_path(spec, weights=weights, needed_by=needed_by)
        default = is_default(spec)
        name = EMBEDDED_NAME if default else str(path.resolve())
        ref = cls(path, name, _read_config(path), parse_device(device), dtype or torch.float32)
        ref._check_model(run=weights and not default)  # the embedded default is eyas's own
        return ref

    def _check_model(self, *, run: bool) -> None:
        """A target model's config: not a draft's (passed as --target by mistake), and, for a target
        that runs, with the dimensions every verb builds from, named here rather than failing later."""
        fmt = detect_format(self.config)
        if fmt is not None:
            raise FormatError(f"target {self._config_file()} is an EAGLE-3 draft's config ({fmt}), not a model's",
                              "pass the model the draft runs on as --target; the draft goes as DRAFTER")
        if run:
            for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
                self._field(key)

    # --- facts from the config ------------------------------------------------------------------

    @property
    def folder(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent

    @property
    def text_config(self) -> dict:
        """The language model's config: multimodal targets nest it under `text_config`."""
        return language_config(self.config)

    @property
    def num_layers(self) -> int:
        return int(self._field("num_hidden_layers"))

    @property
    def hidden_size(self) -> int:
        return int(self._field("hidden_size"))

    @property
    def vocab_size(self) -> int:
        return int(self._field("vocab_size"))

    def _field(self, key: str) -> int:
        return target_size(str(self._config_file()), self.text_config, key)

    def _config_file(self) -> Path:
        return self.path if self.path.is_file() else self.path / "config.json"

    # --- tensors, read by name ----------------------------------------------------------------

    def tensors(self, names: Iterable[str], *, dtype: torch.dtype | None = None,
                device: torch.device | None = None) -> dict[str, Tensor]:
        """Only the named tensors, from only the shards that hold them (the model is never built).

        `embed_tokens.weight`, `norm.weight` and `lm_head.weight` are the drafter's names for the
        target's tensors (lm_head is the embedding matrix when tied); any other name is read as
        written on disk. Keyed by the names asked for; floats converted to `dtype` and moved to
        `device` where given. A tensor still in use, as stored or converted, is handed out again
        rather than read again: the draft's borrowed embeddings and a tied lm_head are one read.
        """
        names = list(names)
        on_disk = {n: self.on_disk(n) for n in names}
        wanted = set(on_disk.values())
        found = {hf: self._alive[(hf, dtype, device)] for hf in wanted if (hf, dtype, device) in self._alive}
        stored = {hf: self._alive[(hf, None, None)] for hf in wanted - set(found) if (hf, None, None) in self._alive}
        missing = wanted - set(found) - set(stored)
        fresh = read_tensors(self.folder, missing) if missing else {}
        for hf, t in sorted(fresh.items()):
            bad = not_finite(hf, t) if t.is_floating_point() else None
            if bad is not None:  # a judge on a nan norm or lm_head said acceptance 0 and blamed the answers
                raise FormatError(f"{self.folder}: {bad['problem']}", "the target's weights are corrupt (or a "
                                  "conversion overflowed): restore them from their source")
        self.read.extend(sorted(fresh))
        for hf, t in {**stored, **fresh}.items():
            self._alive[(hf, None, None)] = t
            found[hf] = self._alive[(hf, dtype, device)] = _placed(t, dtype, device)
        return {n: found[hf] for n, hf in on_disk.items()}

    def embeddings(self, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Tensor:
        """The target's input embeddings [V, H]: what a draft without its own embed_tokens uses."""
        return self.tensors(["embed_tokens.weight"], dtype=dtype, device=device)["embed_tokens.weight"]

    def head(self, dtype: torch.dtype | None = None, *, normed: bool = False) -> TargetHead:
        """The final norm and lm_head on this ref's device, lm_head in `dtype` (default: the ref's); either of
        another shape than config.json says is refused (a norm of the wrong width failed in the product, an
        lm_head of fewer rows judged over fewer tokens, unsaid). `normed`: for states stored after the final
        norm, which is then neither read nor returned (the verdict is lm_head's alone)."""
        refuse_head_bias(self._stored("lm_head.bias") is not None, f"--target {self.folder}")
        lm_head = self.tensors(["lm_head.weight"], dtype=dtype or self.dtype, device=self.device)["lm_head.weight"]
        H, V, types = self.hidden_size, self.vocab_size, self.model_types()
        if normed:
            norm = bias = None
        elif types & WEIGHTLESS_NORM and self._stored(HF_NAMES["norm.weight"]) is None:  # OLMo's, nanochat's
            norm = bias = None
        else:
            norm = self.tensors(["norm.weight"], device=self.device)["norm.weight"]
            bias = self.tensors(["norm.bias"], device=self.device)["norm.bias"] \
                if self._stored(HF_NAMES["norm.bias"]) else None
        for name, t, want in (("norm.weight", norm, [H]), ("norm.bias", bias, [H]),
                              ("lm_head.weight", lm_head, [V, H])):
            if t is not None and list(t.shape) != want:
                raise FormatError(f"{self.folder}: {self.on_disk(name)} is {list(t.shape)}, config.json says {want} "
                                  "(hidden_size, vocab_size)", "pass the config.json that came with these weights")
        final = None if normed else TargetNorm.unweighted(H, types, self.text_config, self.device) if norm is None \
            else TargetNorm.of(norm, types, self.text_config, bias)
        return TargetHead(lm_head, final, self.logit_map())

    def on_disk(self, name: str) -> str:
        """The name in the target's files of the drafter's `name` (embed_tokens, norm, lm_head: HF_NAMES; lm_head
        is embed_tokens where tied), under a multimodal target's language model (LANGUAGE_MODEL) where the files
        hold it there and not under Llama's; any other name as written."""
        if name == "lm_head.weight" and self.tied_embeddings():
            name = "embed_tokens.weight"
        llama = HF_NAMES.get(name)
        return name if llama is None else self._stored(llama) or llama

    def _stored(self, llama: str) -> str | None:
        """`llama` (an HF_NAMES value) as the files hold it: under Llama's name, else under a multimodal target's
        language model (LANGUAGE_MODEL); None where they hold it under neither."""
        outer = "model." if llama.startswith("model.") else ""
        names = (llama, *(prefix + llama.removeprefix(outer) for prefix in LANGUAGE_MODEL[outer]))
        return next((n for n in names if n in self.tensor_names()), None)

    def model_types(self) -> set[str]:
        """The config's model_type and its language model's (a multimodal target's text_config)."""
        return {t for t in (self.config.get("model_type"), self.text_config.get("model_type")) if isinstance(t, str)}

    def logit_map(self) -> LogitMap:
        """What the target's class does to lm_head's output (eyas.logit_map), read from config.json as
        transformers' class reads it (MiniCPM3's scale is a property of it), else as written; a value its class
        cannot use is refused naming config.json."""
        family = self.config.get("model_type")
        known = isinstance(family, str) and family in FAMILIES  # others: nothing to read, transformers not asked
        config = self._transformers_config() if known and self.path.is_dir() else None
        text = self.text_config if config is None else config.get_text_config(decoder=True)
        return logit_map(family, text, f"--target {self.path}")

    def norm_digest(self) -> str | None:
        """A fingerprint of these weights for a capture to record: the SHA-256 of the final norm rounded to
        bf16 (H numbers, one read from the one shard that holds them). Another checkpoint of the same shape
        or a fine-tune that moves the norm changes it (a merged LoRA does not); a copy, a move or another
        load precision does not, and neither does a bf16 re-save (an fp16 one of fp32 weights does: the
        double rounding). None where the weights are not here, are one pickle (read whole for one
        tensor: not for a digest), or hold no final norm under Llama's name or a language model's (`on_disk`)."""
        found = find_weights(self.folder)
        if found is None or not found.name.endswith((".safetensors", ".safetensors.index.json")):
            return None
        try:
            if "norm.weight" not in self._norm:
                self._norm["norm.weight"] = self.tensors(["norm.weight"])["norm.weight"]
        except FormatError:
            return None
        norm = self._norm["norm.weight"]
        return hashlib.sha256(norm.to(torch.bfloat16).view(torch.int16).numpy().tobytes()).hexdigest()[:16]

    def tied_embeddings(self) -> bool:
        """lm_head shares embed_tokens: as config.json says, else when the weights hold no lm_head.

        The weights decide when the config is silent, because the default differs by model class
        and reading it would need the class (transformers' AutoConfig; custom ones run code). A multimodal
        target is tied as its outer config says, which transformers reads with its class's defaults and
        rules (Gemma 3's and Mistral 3's classes tie by default whatever `text_config` says): that class.
        """
        outer = self._transformers_config() if self.text_config is not self.config else None
        said = getattr(outer, "tie_word_embeddings", None)  # None: not multimodal, or no class for it
        if not isinstance(said, bool):
            said = self.text_config.get("tie_word_embeddings", self.config.get("tie_word_embeddings"))
        if isinstance(said, bool):
            return said
        return self._stored(HF_NAMES["lm_head.weight"]) is None

    def _transformers_config(self) -> Any:
        """config.json as transformers' class for it reads it, defaults and compatibility rules applied; None
        where transformers has no class for it (the checkpoint's own would run its code) or cannot read it."""
        from transformers import AutoConfig

        if "config" not in self._auto:
            try:
                self._auto["config"] = AutoConfig.from_pretrained(self.folder, trust_remote_code=False)
            except (ValueError, KeyError, TypeError, AttributeError, OSError):
                self._auto["config"] = None
        return self._auto["config"]

    def tensor_names(self) -> frozenset[str]:
        """Every tensor name the target's weights hold (from the index or headers: no data read; once)."""
        if "names" not in self._names:
            self._names["names"] = frozenset(_tensor_names(self.folder))
        return self._names["names"]

    def weight_bytes(self, dtype: torch.dtype | None = None) -> int:
        """The weights' size once loaded in `dtype` (default: this ref's), from the files' headers."""
        return weight_bytes(self.folder, dtype or self.dtype)

    def has_tokenizer(self) -> bool:
        """Whether the target's folder ships a tokenizer (a file transformers builds one from)."""
        return any((self.folder / f).is_file() for f in TOKENIZER_FILES)

    def missing_chat(self) -> str | None:
        """Why prompts cannot be answered as a chat's assistant turn (None: they can): no tokenizer files, or
        no chat template beside them. From the files alone, so a verb says it before the model loads."""
        if not self.has_tokenizer():
            return f"{self.folder} has no tokenizer ({', '.join(TOKENIZER_FILES)})"
        if any((self.folder / f).is_file() for f in ("chat_template.jinja", "chat_template.json")):
            return None
        try:
            said = json.loads((self.folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            said = {}
        if isinstance(said, dict) and said.get("chat_template"):
            return None
        return f"{self.folder} has no chat template (chat_template.jinja, or chat_template in tokenizer_config.json)"

    def missing_model(self) -> str | None:
        """Why the whole model is not here (None: it is): a verdict from a feature cache needs the final
        norm and lm_head alone, but answering prompts needs every shard the index names and the decoder
        layers. Said before loading: transformers would build the model and fill the rest at random."""
        if self.path.is_file() or find_weights(self.folder) is None:
            return f"{self.path} has no weight files"
        absent = [f for f in weight_files(self.folder) if not (self.folder / f).is_file()]
        if absent:
            more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
            return f"{self.folder} lacks {absent[0]}{more}, named by its weight index"
        names = self.tensor_names()  # the language model's last layer (a vision tower's has other parents)
        if not any(_llama_style(parent) for parent in self._last_layer_parents()):
            return f"the weights in {self.folder} hold {len(names)} tensors and no decoder layer {self.num_layers - 1}"
        return None

    def foreign_decoder(self) -> str | None:
        """Where the weights hold the decoder layers under another family's names (GPT-NeoX's
        `gpt_neox.layers.N`, GPT-J's `transformer.h.N`) and none under Llama's `model.layers.N`: eyas
        runs Llama-style decoders, and "no decoder layer N" would send the user after missing files. A language
        model with cross-attention layers among them is said too (`cross_attention`)."""
        crossed = cross_attention(self.text_config)
        parents = self._last_layer_parents() if find_weights(self.folder) is not None else set()
        if crossed or not parents or any(_llama_style(parent) for parent in parents):
            return crossed
        return (f"{self.folder} holds its decoder layers as {min(parents)}.{self.num_layers - 1}.* (model_type "
                f"{self.text_config.get('model_type')!r}), not model.layers.*: eyas runs Llama-style decoders")

    def undecodable(self) -> str | None:
        """Why eyas's decoding cannot run this target (None: it can): layers, as transformers reads its config,
        whose cache eyas cannot cut back to the accepted tokens (linear attention's and Mamba's states,
        convolutions'). `eyas.decode.verify.check_cache` says it after the load; this says
        it from config.json, before minutes of loading. None too where transformers cannot read the config
        without code from the checkpoint (the load says why)."""
        from transformers.cache_utils import get_layer_types_and_kwargs

        config = self._transformers_config()
        try:
            kinds, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        except (ValueError, KeyError, TypeError, AttributeError):  # config None: transformers has no class for it
            return None
        other = sorted(set(kinds) - {"full_attention", "sliding_attention", "chunked_attention"})
        return (f"its layers include {', '.join(other)} (model_type {config.model_type!r}): eyas decodes targets "
                "whose layers are full, sliding-window or chunked attention") if other else None

    def _last_layer_parents(self) -> set[str]:
        """The prefixes under which the weights hold the last decoder layer (`model.layers`, a multimodal
        target's `model.language_model.layers`, GPT-NeoX's `gpt_neox.layers`, GPT-J's `transformer.h`)."""
        last = re.compile(rf"^((?:.*\.)?(?:layers|h|blocks|block))\.{self.num_layers - 1}\.")
        return {m.group(1) for n in self.tensor_names() if (m := last.match(n))}


def cross_attention(text: dict) -> str | None:
    """Why a language model with cross-attention layers (Llama 3.2 Vision's) is not run: on text transformers
    skips them, so the input of such a layer is never computed and its cache holds nothing to trim."""
    layers = text.get("cross_attention_layers")
    return (f"its language model has cross-attention layers {layers} (model_type {text.get('model_type')!r}), "
            "skipped on text: eyas captures and decodes decoder-only language models") if layers else None


def _llama_style(parent: str) -> bool:
    """Whether decoder layers under `parent` are a Llama-style language model's (a vision tower's are not)."""
    return parent == "layers" or parent.endswith("model.layers")


def _placed(t: Tensor, dtype: torch.dtype | None, device: torch.device | None) -> Tensor:
    """`t` in `dtype` (floats only) on `device`; None keeps what it has (and `t` itself)."""
    return t.to(device=device or t.device, dtype=dtype if dtype is not None and t.is_floating_point() else t.dtype)


def _tensor_names(folder: Path) -> set[str]:
    """Every tensor name the weights in `folder` hold, from the index or the headers (no data read)."""
    found = find_weights(folder)
    if found is None:
        return set()
    if found.name.endswith(".index.json"):
        try:
            return set(json.loads(found.read_text(encoding="utf-8"))["weight_map"])
        except (ValueError, KeyError, TypeError):
            return set()
    try:
        if found.suffix == ".safetensors":
            with safe_open(str(found), "pt") as f:
                return set(f.keys())
        try:  # mapped, not read: a 16 GB pickle is loaded once, by the model, not for its names too
            return set(torch.load(found, map_location="cpu", weights_only=True, mmap=True))
        except RuntimeError:  # the legacy (non-zip) format cannot be mapped
            return set(read_tensors(folder))
    except UNREADABLE as e:  # truncated, garbled: said here, where a verb first reads the target's weights
        raise FormatError(f"target weights {found}: not readable ({str(e).strip()[:200]})",
                          "check the file's permissions; if it is truncated or damaged, copy the target's weights "
                          "again") from None


def _resolve_path(spec: str | Path | None, *, weights: bool, needed_by: str) -> Path:
    if is_default(spec):
        return embedded_default_dir()
    given = path = Path(spec).expanduser()
    if path.is_file():
        if path.name != "config.json":  # a config under another name stands for no model folder
            if weights:
                raise _no_weights(needed_by, f"{given} is a file, not a model folder or its config.json")
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


def _read_config(found: Path) -> dict:
    path = found if found.is_file() else found / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise FormatError(f"{path} is not valid JSON: {e}", "restore the target's config.json") from None
    if not isinstance(config, dict):
        raise FormatError(f"{path} holds a JSON {type(config).__name__}, not an object",
                          "restore the target's config.json")
    return config


# --- the spec-taking forms every caller used before the ref existed ---------------------------


def resolve_target(spec, *, weights: bool = True, needed_by: str = "this command") -> Path:
    """The target's folder (or lone config file): `TargetRef.resolve(spec).path`."""
    return TargetRef.resolve(spec, weights=weights, needed_by=needed_by).path


def target_name(spec) -> str:
    """The identity recorded for a target (manifests, verifier)."""
    return TargetRef.resolve(spec, weights=False).name


def target_config(spec) -> dict:
    """The target's config as a dict; no weights are read."""
    return TargetRef.resolve(spec, weights=False).config


def target_tensors(spec, names: Iterable[str]) -> dict[str, Tensor]:
    """`TargetRef.resolve(spec).tensors(names)`."""
    return TargetRef.resolve(spec).tensors(names)


def load_target_embeddings(spec) -> Tensor:
    return TargetRef.resolve(spec).embeddings()
