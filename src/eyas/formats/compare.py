"""A folder's config files: which exist, which one defines the contract, and where they disagree.

Training pipelines export several configs side by side (`config.json`, `config_speculators.json`,
`config_eagle.json`). All are read; one is used (speculators first: its layer ids are unambiguous);
every field two files read differently is a finding graded by what it changes, a field one file states
and the other leaves to its default included (a reader of the silent file takes the default). Capture layers,
norm flags, dimensions, vocab and rope change what the draft computes: a problem. The context length,
an epsilon equal to 6 significant digits, or the recorded verifier do not: a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eyas.codes import finding
from eyas.contract import IDS
from eyas.errors import FormatError
from eyas.formats.parsed import Parsed
from eyas.formats.schema import CONFIG_NAMES, NORM_FLAGS

_DIMS = (
    "layer_type",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "num_hidden_layers",
    "hidden_act",
    "attention_bias",
    "sliding_window",
    "target_hidden_size",
    "unsupported",
)
# contract field (as the parsers name it) -> the code of a disagreement on it
DISAGREEMENT_CODES: dict[str, str] = {
    "capture_layers": "config_files_disagree_capture_layers",
    **{f: "config_files_disagree_norm_flags" for f in NORM_FLAGS},
    **{f: "config_files_disagree_dims" for f in _DIMS},
    "vocab_size": "config_files_disagree_vocab",
    "draft_vocab_size": "config_files_disagree_vocab",
    "rope_theta": "config_files_disagree_rope",
    "rope_scaling": "config_files_disagree_rope",
    "rms_norm_eps": "config_files_disagree_eps",
    "max_position_embeddings": "config_files_disagree_context",
    "verifier_name": "config_files_disagree_verifier",
    "verifier_architectures": "config_files_disagree_verifier",
    "verifier_model_type": "config_files_disagree_verifier",
    "embed_scale": "config_files_disagree_embed_scale",
}
_IN_FILE = {"capture_layers": IDS, "layer_type": "model_type"}  # contract field -> the key a file writes
_EPS_DIGITS = 6  # epsilons equal to this many significant digits are the same number, printed differently


def config_paths(path: Path) -> dict[str, Path]:
    """The config files to read: `path` itself when it is a file, else every known name in the folder."""
    if path.is_file():
        return {path.name: path}
    if not path.is_dir():
        raise FormatError(f"{path}: no such file or folder", "pass a draft folder or a draft config .json file")
    found = {n: path / n for n in CONFIG_NAMES if (path / n).is_file()}
    there = [path / n for n in CONFIG_NAMES if (path / n).is_symlink() or (path / n).exists()]
    if not found and there:  # a folder so named, or a link to nothing (or to itself)
        raise FormatError(f"{there[0]}: is there but is not a readable file ({_what(there[0])})",
                          "replace it with the draft's config JSON file")
    if not found:
        raise FormatError(
            f"{path}: no config file (looked for {', '.join(CONFIG_NAMES)})",
            "a draft folder needs its config.json next to the weights",
        )
    return found


def _what(path: Path) -> str:
    if path.is_dir():
        return "a folder"
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python 3.11 raises this on a loop; 3.13 an OSError
        return "a link that loops"
    except OSError as e:
        return "a link that loops" if "loop" in str(e).lower() else "a link to nothing"
    return "not a regular file"


def choose_config(files: dict[str, str]) -> tuple[str, str]:
    """Which config file defines the contract when a folder holds several, and why."""
    if len(files) == 1:
        return next(iter(files)), "the only config file"
    spec = [n for n in files if files[n] == "speculators"]
    name = spec[0] if spec else "config.json" if "config.json" in files else next(iter(files))
    return name, "speculators format (its layer ids are unambiguous)" if spec else "what engines read"


def agreement(files: dict[str, str], used: str, disagreements: list[dict[str, str]]) -> str:
    """How the other config files relate to the one used, for `Checkpoint.reason`."""
    others = [n for n in files if n != used]
    if not others:
        return ""
    if not disagreements:
        return f"; agrees with {', '.join(others)}"
    return f"; {', '.join(others)} disagree{'s' if len(others) == 1 else ''} on " + ", ".join(
        dict.fromkeys(d["field"] for d in disagreements)
    )


def disagreements(parsed: dict[str, Parsed], used: str, conv: str | None) -> list[dict[str, str]]:
    """Every field that another config file reads differently from `used` (one stating what the other leaves
    to a default included), as a graded finding."""
    ref, out = parsed[used], []
    for name, p in parsed.items():
        if name == used:
            continue
        for key in sorted(set(p.fields) & set(ref.fields)):
            a, b = p.fields[key], ref.fields[key]
            if (key in p.assumed and key in ref.assumed) or _canonical(key, a) == _canonical(key, b):
                continue
            if key.startswith("verifier_") and not (a and b):
                continue
            text = f"{name} and {used} disagree on {key}: {a!r} ({p.origin[key]}) vs {b!r} ({ref.origin[key]})"
            silent = name if key in p.assumed else used if key in ref.assumed else None
            unresolved = key == "capture_layers" and None in (a, b)
            out.append(finding(_code(key, a, b), key, text, _hint(key, used, silent, conv, unresolved)))
    return out


def _hint(key: str, used: str, silent: str | None, conv: str | None, unresolved: bool) -> str:
    """How to settle a disagreement: state the value in the file that leaves it to a default (`silent`),
    or fix the wrong file; for eagle layer ids, the other conventions; `unresolved`: capture layers left
    to the engines' default of a target not given."""
    if silent is not None:
        hint = (f"write {_IN_FILE.get(key, key)} in {silent} too (a reader of {silent} takes the default), "
                "or delete the file that is wrong")
        return hint + ("; with --target eyas compares the engines' default for its layer count" if unresolved else "")
    hint = f"fix the wrong file, or delete it (eyas prefers {used})"
    if key == "capture_layers" and conv is None:
        hint += "; if the eagle ids use another convention, pass --layer-convention input|output"
    return hint


def _canonical(key: str, value: Any) -> Any:
    """A value as readers understand it, for comparing: rope_scaling's legacy `type` is `rope_type`
    (transformers and vLLM read either)."""
    if key != "rope_scaling" or not value:
        return value
    out = dict(value)
    if "type" in out:
        out.setdefault("rope_type", out.pop("type"))
    return out


def _code(key: str, a: Any, b: Any) -> str:
    if key == "rms_norm_eps" and f"{a:.{_EPS_DIGITS}g}" == f"{b:.{_EPS_DIGITS}g}":
        return "config_files_disagree_eps_rounding"
    return DISAGREEMENT_CODES[key]
