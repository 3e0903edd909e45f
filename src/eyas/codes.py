"""Stable machine codes for every problem and warning eyas reports.

A finding is a dict: {"code", "field", "problem" (or "warning"), "fix"}. The English text may be
reworded at any time; the code may not. `eyas check --json`, `eyas inspect --json` and the doctor
carry the code, and the doctor ranks findings by the code's fault slug, never by matching text.

Each code has one rule, written once (in eyas.formats.validate, eyas.check or eyas.contract), and
this table says what kind of fault it is: `slug` names the doctor's fault (None: the finding does
not change what the draft computes), `severity` says whether it is a problem (check exits 1) or
a warning.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    severity: str  # "problem" or "warning"
    slug: str | None  # the doctor fault it points at, None if it does not change the draft's output
    meaning: str  # one line, for docs and `--json` readers


CODES: dict[str, Code] = {}  # filled below, one entry per code


def finding(code: str, field: str, text: str, fix: str) -> dict[str, str]:
    """A problem or warning record; `code` must be registered (an unknown code is a bug in eyas)."""
    c = CODES[code]
    return {"code": code, "field": field, c.severity: text, "fix": fix}


def slug_of(code: str) -> str | None:
    return CODES[code].slug
