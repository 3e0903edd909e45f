"""One config file as read: the DraftContract keywords it gives, where each came from, what it left to
a default, its warnings, and the parts eyas has no code for. `eyas.formats.parse` fills one per file;
`compare` and `read` consume them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eyas.codes import finding
from eyas.errors import FormatError

_REQUIRED = object()
Check = Callable[[str, str, Any], Any]  # (file, field, value) -> the value as eyas uses it, or FormatError


@dataclass
class Parsed:
    """One config file read into DraftContract keywords, with provenance."""

    file: str
    fields: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    assumed: set[str] = field(default_factory=set)  # fields the file does not state
    warnings: list[dict[str, str]] = field(default_factory=list)  # findings, severity "warning"
    unrunnable: list[str] = field(default_factory=list)  # parts eyas has no code for (contract `unsupported`)
    # those of them with tensors a dense Llama/Qwen3 layer has not (experts, latent attention, extra norms):
    # the weights are checked against eyas's layout unless one is named here (a rope or activation is no tensor)
    foreign_layout: list[str] = field(default_factory=list)
    class_layer: str | None = None  # the layer the config's class builds, where model_type named another

    def read(self, src: dict, key: str, check: Check, *, where: str = "", default: Any = _REQUIRED) -> Any:
        """src[key] passed through `check` (eyas.formats.values), stored as contract field `key` with its origin."""
        value = src.get(key)
        if value is None:
            if default is _REQUIRED:
                how = "is null" if key in src else "is missing"
                raise FormatError(f"{self.file}: field '{where}{key}' {how}", f"set {where}{key} in {self.file}"
                                  if key in src else f"add {where}{key} to {self.file}")
            self.fields[key], self.origin[key] = default, f"default {default!r} ({where}{key} not in {self.file})"
            self.assumed.add(key)
            return default
        value = check(self.file, where + key, value)
        self.fields[key], self.origin[key] = value, f"{self.file}: {where}{key}"
        self.assumed.discard(key)
        return value

    def set(self, to: str, value: Any, origin: str, *, assumed: bool = False) -> None:
        self.fields[to], self.origin[to] = value, origin
        if assumed:
            self.assumed.add(to)
        else:
            self.assumed.discard(to)

    def warn(self, code: str, field_: str, text: str, fix: str) -> None:
        self.warnings.append(finding(code, field_, text, fix))
