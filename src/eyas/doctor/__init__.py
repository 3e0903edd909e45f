"""`eyas doctor`: why a draft gets low acceptance, named as a wiring fault, with numbers and a fix.

A draft is only as good as its wiring: which target states feed it, in which order, normed or not,
at which position, with which norm flags, embeddings, vocab map and rope. Exporters and engines get
each of these wrong in known ways, and every one fails silently: the draft still drafts, acceptance
just drops. `diagnose` looks three ways:

1. Static: everything `eyas check` finds, joined to the doctor's faults by code (eyas.codes), plus
   where vLLM, SGLang and speculators would wire the checkpoint differently from its contract
   (`eyas.check.consumers`), each with the fix.
2. Measured: the target answers a few prompts ONCE, and one forward records the residual stream at
   every index 0..N plus the final-normed state (`collect`). Every alternative wiring is then a
   slice, permutation, norm or shift of those tensors, or a change to the drafter, scored on the
   same positions. A hypothesis is reported only when it beats the current wiring significantly
   (`paired_test`, `beats`) on continuous evidence: the draft's log-probability of the target's
   token and its divergence from the target's distribution, per position, so a fault shows even
   on a weak draft whose argmax it rarely flips; never one that measurably loses acceptance, nor
   one the answers do not share (positions of one answer are not independent: where positions and
   answers disagree, the doctor answers more prompts and measures again). The
   winner that accepts the most is adopted and the rest are re-tested against it, so a second
   fault hiding behind the first is found too. A draft that accepts almost nothing under every
   wiring (MIN_USABLE) is trained for none of them, and what its weights lean to is not named. An
   `ok` states the smallest change it would have detected. Given a trainer's feature cache, the
   sequences are the tokens of its first samples instead of answers to prompts (eyas.doctor.caches).
3. Engine dumps: what an engine actually fed the draft (`features[t]` for `input_ids[t]`, layout in
   docs/engine-dumps.md), or a cache's first sample, is matched chunk by chunk against the target's
   states (`match_dump`).

Nothing here prints except progress on stderr; `diagnose` returns a JSON-ready dict and
`format_report` renders it.

Modules, in the order a diagnosis uses them:
- `capture`: `Capture`, `collect` and `Feed`, the target's states recorded once per diagnosis; the defaults.
- `wiring`: `Wiring`, every choice that decides what the draft computes, and `contract_wiring`.
- `stats`: `Outcome` (per-position results) and the paired tests (`paired_test`, `beats`, `detectable`).
- `measure`: `Measurer`, the harness that runs the draft under any wiring and caches its outcome.
- `hypotheses`: the catalogue of faults, each an alternative wiring with the fix it implies.
- `findings`: how a finding is recorded and worded (`SLUGS`, the fault names).
- `search`: rounds of hypotheses against the current wiring, and the capture-layer climb.
- `configs`: a folder's config files, each measured as the wiring it states.
- `serving`: engines that would wire the draft worse than its weights fit.
- `static`: `eyas check` problems and consumer hazards, ranked by their codes.
- `dumps`: engine dumps (read by eyas.data.dumps) matched against the target's states.
- `caches`: a trainer's feature cache as evidence: its samples' tokens (`CacheFeed`), or as stored.
- `diagnose`: the entry point. `report`: `format_report`.
"""

from eyas.data.dumps import read_dump
from eyas.doctor.capture import DEFAULT_LIMIT, DEFAULT_MAX_NEW_TOKENS, DEFAULT_PROMPTS, Capture, collect
from eyas.doctor.diagnose import diagnose
from eyas.doctor.dumps import match_dump
from eyas.doctor.findings import SLUGS
from eyas.doctor.measure import Measurer
from eyas.doctor.report import format_report
from eyas.doctor.stats import DEPTH, Outcome, beats, binomial_tail, detectable, paired_test, signed_rank
from eyas.doctor.wiring import Wiring, contract_wiring

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_PROMPTS",
    "DEPTH",
    "SLUGS",
    "Capture",
    "Measurer",
    "Outcome",
    "Wiring",
    "beats",
    "binomial_tail",
    "collect",
    "contract_wiring",
    "detectable",
    "diagnose",
    "format_report",
    "match_dump",
    "paired_test",
    "read_dump",
    "signed_rank",
]
