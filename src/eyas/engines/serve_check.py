"""`eyas serve-check`: serve a draft in a real engine, and hold what it accepts against eyas's prediction.

The engine (vLLM, in its own venv and process: `eyas.engines.launch`) generates with the draft
(greedily, or sampling at a temperature) and reports its spec-decode counters, its wiring (from its
live model objects) and what it fed the draft (a dump). eyas then measures the same draft on the
SAME token sequences (`eyas.engines.predict`) and compares (`eyas.engines.compare`): acceptance
within noise, the engine's wiring equal to the contract, and the engine's drafts eyas's. Served
minus predicted, prompt by prompt from the engine's counters per request, is reported with its
paired 95% interval over resampled prompts. When sampling, eyas's expectation is taken on the
engine's own draft steps, the engine's tokens are tested against the target's distribution, and the
same engine without speculation is the control. When they disagree, `explanation` says why, from
the engine's own report, eyas's consumer view (`eyas.check.consumers`, which also predicts refusals)
and, when the engine fed other states than the contract's, the doctor's dump analysis.
"""

from __future__ import annotations

import math
import tempfile
import time
import warnings
from collections.abc import Container
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eyas.atomic import write_bytes
from eyas.check import check_checkpoint, consumers
from eyas.codes import text_of
from eyas.data import Prompt, encode_prompts, read_prompts, short_of_limit
from eyas.drafter_loading import load_drafter, read_fitting, resolve_drafter
from eyas.engines.compare import (DRAFTS_SAME, acceptance_agreement, drafts_agreement, dump_check, paired_difference,
                                  rates, sampled_agreement, samples_test, wiring_report)
from eyas.engines.launch import engine_python, run_vllm, said_by_engine
from eyas.engines.predict import SampledPrediction, compare_drafts, output_fit, predict, predict_sampled
from eyas.contract import default_capture_layers
from eyas.errors import EyasError
from eyas.formats import Checkpoint
from eyas.intervals import FEW
from eyas.target import Target
from eyas.target_ref import TargetRef

ENGINES = ("vllm",)
NO_SPECULATION = "no speculation"
MAX_MODEL_LEN = 1024
DEFAULT_LIMIT = 10  # prompts served
# Worker budget: start-up and load per engine, then generation (CPU, batch 1, fp32), generously.
START_SECONDS, TOKEN_SECONDS = 240, 1.0


def vllm_spec(draft_dir: str | Path, k: int) -> dict[str, Any]:
    """vLLM's speculative_config for an EAGLE-3 draft folder (the method is never left to detection)."""
    return {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": k}


def model_len(target: Target | TargetRef) -> int:
    """vLLM's max_model_len: MAX_MODEL_LEN, or the target's context where that is shorter (vLLM refuses
    a max_model_len beyond the model's, which would read as the draft's fault)."""
    if isinstance(target, TargetRef):
        context = target.text_config.get("max_position_embeddings")
    else:  # the config object: its attribute_map aliases (n_positions, ...) answer too
        context = getattr(target.config, "max_position_embeddings", None)
    return min(MAX_MODEL_LEN, context or MAX_MODEL_LEN)


def prompt_ids(target: Target, prompts: str | Path, listed: list[Prompt], max_new_tokens: int) -> list[list[int]]:
    """The prompts `listed` (read from `prompts`) as eyas capture and eval feed them: chat-templated token ids.
    Those that do not fit the engine's context with their answers are left out, with a warning naming how many
    and the first (a packaged set cannot be edited; unsaid, fewer prompts were served than asked for); none
    fitting is refused."""
    context = model_len(target)
    ids, skipped = encode_prompts(target, listed, max_new_tokens, context, True)
    kept = [i for i in ids if i is not None]
    if not kept:
        raise EyasError(f"no prompt of {prompts} fits the {context} tokens serve-check gives vLLM with "
                        f"{max_new_tokens} new ones", "use shorter prompts or fewer --max-new-tokens")
    if skipped:
        first = skipped[0]
        warnings.warn(f"{len(skipped)} of {len(ids)} prompts do not fit the {context} tokens serve-check "
                      f"gives vLLM with {max_new_tokens} new ones and are left out (first: {first['origin']}, "
                      f"{first['tokens']} tokens)", stacklevel=2)
    return kept


def engine_job(target: Target, prompts: list[list[int]], runs: list[dict[str, Any]], max_new_tokens: int,
               temperature: float = 0.0) -> dict[str, Any]:
    return {"target": str(target.path), "prompts": prompts, "max_new_tokens": max_new_tokens,
            "max_model_len": model_len(target), "temperature": temperature, "runs": runs}


def timeout_for(runs: int, prompts: int, max_new_tokens: int) -> float:
    return runs * (START_SECONDS + TOKEN_SECONDS * prompts * max_new_tokens)


def _statements(view: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """Each thing eyas's consumer view says about vLLM, against what the engine did."""
    w = run.get("wiring") or {}
    out = [{"statement": "loads", "eyas": view["loads"], "engine": run["loaded"]}]
    if run["loaded"] and view["loads"]:
        shared = "draft's own" if w.get("has_own_embed_tokens") else "shares target's"  # see compare._embeddings
        out += [{"statement": "capture_layers", "eyas": view["capture_layers"], "engine": w.get("aux_layers")},
                {"statement": "norm_before_residual", "eyas": view["norm_before_residual"],
                 "engine": w.get("norm_before_residual")},
                *({"statement": f, "eyas": v, "engine": w.get(f)} for f, v in (view["norm_flags"] or {}).items()),
                {"statement": "embeddings", "eyas": view["embeddings"], "engine": shared}]
    for s in out:
        s["holds"] = s["eyas"] == s["engine"]
    return out


def _explain(report: dict[str, Any], view: dict[str, Any]) -> list[str]:
    """Why served and predicted disagree, most telling first."""
    out = [f"wiring: {d}" for d in report["wiring"]["differences"]]
    for t in report["positions"]:
        if not t["within_noise"]:
            p = f", p = {t['p']:.1g}" if "p" in t else ""
            out.append(f"acceptance at position {t['position']}: served {t['served']:.3f}, eyas predicts "
                       f"{t['predicted']:.3f} (z = {t['z']:.1f}{p}, beyond the noise of this many drafts)")
    dc = report.get("drafts_compared")
    if not drafts_agreement(dc):
        out.append(f"drafts: vLLM's first draft token is eyas's at {dc['first_token_same']:.0%} of {dc['drafts']} "
                   f"chain starts, where the same prefixes and weights in fp32 share {DRAFTS_SAME:.0%} or more: the "
                   "engine feeds or computes the draft otherwise (" + ("the wiring above" if report["wiring"][
                       "differences"] else "its attention, rope, norms or embeddings") + ")")
    t = report.get("samples")
    if t and not t["faithful"]:
        out.append(f"the engine's tokens are not samples of the target's distribution at temperature "
                   f"{report['temperature']:g}: {_samples_text(t)}")
    said = [text_of(m) for m in view["mismatches"]] + [n for n in view["notes"] if "no layer ids" in n or "absent" in n]
    if said:
        out.append("eyas check predicted for vLLM: " + "; ".join(said))
        out += [f"fix: {fix}" for fix in dict.fromkeys(m["fix"] for m in view["mismatches"])]
    wrong = [s for s in report["consumer_view"] if not s["holds"]]
    if wrong:
        version = report["engine_version"]
        out.append("eyas's consumer view was wrong here: " + "; ".join(
            f"{s['statement']}: eyas said {s['eyas']}, vLLM {version} did {s['engine']}" for s in wrong))
    if report.get("predicted") is None:
        out.append("eyas could not run the draft itself, so only the engine's side is reported")
    return out


def _per_request(run: dict[str, Any], k: int) -> list[tuple[int, list[int]]] | None:
    """The engine's (drafts, accepted by position) per request, when they add up to its totals; None
    when they do not (counters that lag a request) or the worker did not read them."""
    per, total = run.get("per_request"), run["counters"]
    if not per:
        return None
    rows = [(r["num_drafts"], (r["accepted_per_pos"] + [0] * k)[:k]) for r in per]
    summed = [sum(c[i] for _, c in rows) for i in range(k)]
    if sum(d for d, _ in rows) != total["num_drafts"] or summed != (total["accepted_per_pos"] + [0] * k)[:k]:
        return None
    return rows


def _steps(drafts: list[list], per: list[tuple[int, list[int]]], k: int) -> list[list[tuple[int, list[int]]]]:
    """Per request, the (chain start, draft tokens) of the steps the engine counted: its first
    `drafts` proposals (the proposal after a request's last token is never verified)."""
    out: list[list[tuple[int, list[int]]]] = [[] for _ in per]
    for req, start, tokens in drafts:
        if 0 <= req < len(per) and len(out[req]) < per[req][0]:
            out[req].append((start, tokens))
    short = [r for r, (n, _) in enumerate(per) if len(out[r]) < n or any(len(t) < k for _, t in out[r])]
    if short:
        raise EyasError(f"vLLM counted more draft steps than eyas recorded for request {short[0]} (or shorter "
                        f"drafts than {k})", "rerun serve-check; report it with the vLLM version if it persists")
    return out


def _sampled(report: dict[str, Any], target: Target, prompts: list[list[int]], run: dict[str, Any], k: int,
             temperature: float) -> bool:
    """At temperature > 0: the served counts against eyas's expectation on the engine's own steps, and
    the engine's tokens against the target's distribution (eyas.engines.predict.predict_sampled)."""
    per = _per_request(run, k)
    if per is None:
        raise EyasError("vLLM's spec-decode counters per request do not add up to its totals, so its steps "
                        "cannot be matched with the drafts recorded", "rerun serve-check; report it with the "
                        "vLLM version if it persists")
    sp = predict_sampled(target, prompts, run["outputs"], _steps(run["drafts"], per, k), k, temperature)
    expected = [sum(e[i] for _, e in sp.per_sequence) for i in range(k)]
    report["predicted"] = rates(expected, sum(d for d, _ in per))
    ok, report["positions"] = sampled_agreement(report["served"], sp.chances)
    report["difference"] = paired_difference(per, sp.per_sequence, k)
    report["samples"] = _samples(target, sp)
    return ok and report["samples"]["faithful"]


def _samples(target: Target, fit: SampledPrediction) -> dict[str, Any]:
    return samples_test(fit, target.model.get_output_embeddings().weight.shape[0])


def _control(target: Target, prompts: list[list[int]], run: dict[str, Any], temperature: float
             ) -> dict[str, Any] | None:
    """The engine's tokens without speculation, against the target's distribution (None: it failed)."""
    if not run["loaded"] or run["error"]:
        return None
    return _samples(target, output_fit(target, prompts, run["outputs"], temperature))


def _blame(control: dict[str, Any]) -> str:
    if control["faithful"]:
        return (f"without speculation the same engine samples the target's distribution "
                f"({_samples_text(control)}): the fault is in its speculative sampling")
    return ("without speculation the engine's tokens do not fit the target's distribution either: "
            + _samples_text(control))


def _doctor(ckpt: Checkpoint, target: Target, fed: tuple[Tensor, Tensor], dump: Path) -> dict[str, Any]:
    """The doctor's dump analysis of `fed` (read from `dump`): which target states the engine fed,
    against the contract's wiring (what eyas predicted the engine would feed), as findings with fixes."""
    from eyas.doctor import contract_wiring
    from eyas.doctor.dumps import check_dump, dump_on_tokens

    check_dump(fed, target, dump)
    final = contract_wiring(ckpt.contract, ckpt.tensors, target.num_layers)
    found, section, _ = dump_on_tokens(ckpt, target, fed, dump, final)
    return {"chunks": section["chunks"],
            "findings": [{"fault": f["fault"], "title": f["title"], "fix": f["fix"]} for f in found]}


def assess(draft_dir: Path, target: Target, prompts: list[list[int]], run: dict[str, Any], k: int, *,
           engine_version: str, dump: Path | None, doctor: bool = True, temperature: float = 0.0) -> dict[str, Any]:
    """Served against predicted for one engine run of `draft_dir` (see the module docstring)."""
    rep = check_checkpoint(draft_dir, target=target.path)
    ckpt = rep.checkpoint
    view = consumers(ckpt)["vllm"]
    report: dict[str, Any] = {
        "engine": "vllm", "engine_version": engine_version, "drafter": str(draft_dir), "target": str(target.path),
        "temperature": temperature,
        "loaded": run["loaded"], "error": run["error"], "draft_tokens": k, "sequences": len(prompts),
        "tokens": sum(len(o) for o in run.get("outputs") or []), "served": None, "predicted": None,
        "agree": False, "positions": [], "difference": None, "samples": None, "control": None, "drafts_compared": None,
        "wiring": {"agree": False, "differences": [], "engine": run.get("wiring"), "contract": None, "dump": None},
        "check": {"problems": [text_of(p) for p in rep.problems], "vllm": view},
        "consumer_view": _statements(view, run), "engine_log": run.get("log", []), "explanation": [],
    }
    if not run["loaded"]:
        predicted = not view["loads"]
        report["refusal_predicted"] = predicted
        report["explanation"] = [f"vLLM {engine_version} refused the draft: {run['error']}",
                                 ("eyas check predicted the refusal: " + "; ".join(view["refused"] or view["notes"]))
                                 if predicted
                                 else "eyas check did NOT predict this refusal (its consumer view needs a fix)"]
        return report
    if run["error"]:
        first, *traceback = run["error"].splitlines()
        said_by_engine(traceback)
        raise EyasError(f"vLLM loaded the draft but failed while generating: {first}",
                        "its traceback is above (vllm|); report it with the draft's config")
    n = run["counters"]
    report["served"] = rates(n["accepted_per_pos"][:k], n["num_drafts"])
    c = ckpt.contract  # no layer ids: eyas captures the engines' default, as `eyas eval` does
    layers = list(c.capture_layers or default_capture_layers(target.num_layers))
    dump_result, ran = None, False
    try:
        drafter = load_drafter(draft_dir, target=target.path, dtype=torch.float32)
        pred = predict(drafter, target, layers, prompts, run["outputs"], k)
        ran = True  # what fails from here is matching the engine's records, not running the draft
        report["drafts_compared"] = compare_drafts(pred, run["drafts"], prompts, k)
        if temperature > 0:
            acc_ok = _sampled(report, target, prompts, run, k, temperature)
        else:
            report["predicted"] = rates(pred.accepted_by_position, pred.drafts)
            report["predicted"]["token_mismatches"] = f"{pred.token_mismatches} of {pred.tokens_compared}"
            acc_ok, report["positions"] = acceptance_agreement(report["served"], report["predicted"])
            per = _per_request(run, k)
            report["difference"] = paired_difference(per, pred.per_sequence, k) if per else None
    except EyasError as e:
        acc_ok = False
        what = "eyas cannot match the engine's records with the draft's steps" if ran else "eyas cannot run the draft"
        report["check"]["problems"].append(f"{what}: {e}")
    if dump is not None and run.get("dump_positions"):
        from eyas.doctor import read_dump

        fed = read_dump(dump)
        dump_result = dump_check(*fed, target, layers)
    report["wiring"] = wiring_report(run.get("wiring") or {}, c, ckpt.tensors.get("d2t"), layers, dump_result)
    if dump_result is not None and not dump_result["matches"] and doctor:
        report["doctor"] = _doctor(ckpt, target, fed, dump)
    report["agree"] = acc_ok and report["wiring"]["agree"] and drafts_agreement(report["drafts_compared"])
    if not report["agree"]:
        report["explanation"] = _explain(report, view)
        for f in (report.get("doctor") or {}).get("findings", []):
            report["explanation"].append(f"doctor (engine dump): {f['title']}; fix: {f['fix']}")
    return report


def serve_check(
    drafter: str | Path | None = None,
    *,
    engine: str = "vllm",
    target: str | Path | None = None,
    prompts: str | Path = "mtbench",
    limit: int | None = None,
    draft_tokens: int = 5,
    max_new_tokens: int = 64,
    dump: str | Path | None = None,
    device: str | torch.device | None = None,
    temperature: float = 0.0,
    progress: bool = True,
) -> dict[str, Any]:
    """Serve `drafter` (None: the draft eyas ships for the target) in `engine` on `limit` prompts (None:
    DEFAULT_LIMIT, and a file shorter than it is not warned about, as one shorter than a limit given is) and
    compare its acceptance and wiring with eyas's prediction; `dump` also keeps what the engine fed
    the draft on the first prompt (eyas dump format, for `eyas doctor --features`). eyas's replay of
    the served sequences runs the target on `device` (vLLM itself serves on the CPU). `temperature` >
    0 serves samples (request i with seed i): acceptance is then held against its expectation on the
    engine's own draft steps, and the engine's tokens against the target's distribution.

    EyasError when the engine is not installed (before anything is loaded) or cannot run at all; a
    draft the engine refuses gives `loaded: false` with the engine's message.
    """
    if engine not in ENGINES:
        raise EyasError(f"engine {engine!r} cannot serve drafts here; serve-check runs {', '.join(ENGINES)}",
                        "llama.cpp's reading of a draft is in `eyas inspect` (its converter runs in the tests)")
    asked, limit = limit, DEFAULT_LIMIT if limit is None else limit
    if draft_tokens < 1 or limit < 1 or max_new_tokens < 2:
        raise EyasError("--draft-tokens and --limit must be >= 1 and --max-new-tokens >= 2", "pass positive sizes")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise EyasError(f"--temperature {temperature}: must be a number >= 0",
                        "0 serves greedily; e.g. --temperature 0.8")
    listed = short_of_limit(read_prompts(prompts, limit=limit), asked, prompts, doing="serving")
    t0 = time.perf_counter()
    engine_python("vllm")  # not installed: say so before loading anything
    ref = TargetRef.resolve(target, weights=False)
    draft_dir = resolve_drafter(drafter, ref).resolve()
    for w in read_fitting(draft_dir, ref).warnings:  # an unusable draft is refused before the engine starts;
        warnings.warn(f"{draft_dir}: {text_of(w)}", stacklevel=2)  # how it was read is said, as inspect says it
    context = model_len(ref)
    if max_new_tokens >= context:
        raise EyasError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the {context} "
                        "tokens serve-check gives vLLM", f"pass --max-new-tokens {context // 2} or fewer")
    tgt = Target.load(target, dtype=torch.float32, device=device)
    ids = prompt_ids(tgt, prompts, listed, max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="eyas-serve-check-") as tmp:
        dump_path = Path(tmp, "dump.safetensors")  # the worker writes here; copied atomically to `dump`
        spec = vllm_spec(draft_dir, draft_tokens)
        runs = [{"name": draft_dir.name, "speculative_config": spec, "dump": str(dump_path)}]
        if temperature > 0:  # the control: the same engine sampling without speculation
            runs.append({"name": NO_SPECULATION, "speculative_config": None, "dump": None})
        result = run_vllm(engine_job(tgt, ids, runs, max_new_tokens, temperature),
                          timeout=timeout_for(len(runs), len(ids), max_new_tokens), progress=progress)
        t1 = time.perf_counter()
        taken = dump_path.is_file()
        report = assess(draft_dir, tgt, ids, result["runs"][0], draft_tokens, engine_version=result["version"],
                        dump=dump_path if taken else None, temperature=temperature)
        report["control"] = _control(tgt, ids, result["runs"][1], temperature) if temperature > 0 else None
        if report["control"] and report["samples"] and not report["samples"]["faithful"]:
            report["explanation"].append(_blame(report["control"]))
        if dump and taken:
            write_bytes(dump, dump_path.read_bytes())
    report.update(prompts=str(prompts), max_new_tokens=max_new_tokens, dump_path=str(dump) if dump and taken else None,
                  seconds={"engine": round(t1 - t0, 1), "eyas": round(time.perf_counter() - t1, 1),
                           "total": round(time.perf_counter() - t0, 1)})
    return report


def serve_check_many(drafts: dict[str, Path], *, target: str | Path | None = None, prompts: str | Path = "mtbench",
                     limit: int = 2, draft_tokens: int = 5, max_new_tokens: int = 24, doctor: Container[str] = (),
                     progress: bool = True) -> dict[str, dict[str, Any]]:
    """`serve_check` for several drafts with ONE engine worker (one `vllm.LLM` per draft, in turn): the
    interpreter and vLLM import once. Reports by name; dumps are always taken, the doctor runs only
    for the names in `doctor` (it costs a diagnosis per draft whose dump does not match)."""
    engine_python("vllm")
    tgt = Target.load(target, dtype=torch.float32)
    ids = prompt_ids(tgt, prompts, read_prompts(prompts, limit=limit), max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="eyas-serve-check-") as tmp:
        runs = [{"name": name, "speculative_config": vllm_spec(Path(d).resolve(), draft_tokens),
                 "dump": str(Path(tmp, f"{name}.safetensors"))} for name, d in drafts.items()]
        result = run_vllm(engine_job(tgt, ids, runs, max_new_tokens),
                          timeout=timeout_for(len(runs), len(ids), max_new_tokens), progress=progress)
        out = {}
        for (name, d), run in zip(drafts.items(), result["runs"]):
            dump = Path(tmp, f"{name}.safetensors")
            out[name] = assess(Path(d).resolve(), tgt, ids, run, draft_tokens, engine_version=result["version"],
                               dump=dump if dump.is_file() else None, doctor=name in doctor)
    return out


def _row(name: str, r: dict[str, Any] | None) -> str:
    if r is None or r["mean_acceptance_length"] is None:
        return f"  {name:<18} -"
    pos = " ".join(f"{x:.3f}" for x in r["acceptance_by_position"])
    return f"  {name:<18} {r['mean_acceptance_length']:.3f}   {pos}   ({r['drafts']} drafts)"


def _samples_text(t: dict[str, Any]) -> str:
    return (f"mean surprisal {t['mean_surprisal']:.2f} nats where the target's entropy is {t['mean_entropy']:.2f} "
            f"(z = {t['z']:.1f}); {t['rare_tokens']} of {t['tokens']} tokens have target probability under "
            f"{t['rare_below']:g} (a faithful sampler: {t['rare_bound']:.2f} on average at most)")


def _difference_lines(d: dict[str, Any] | None) -> list[str]:
    if not d:
        return []
    m, few = d["mean_acceptance_length"], f" (under {FEW} prompts: too narrow)" if d["samples"] < FEW else ""
    lo, hi = m["ci95"]
    if d["samples"] < 2:  # one prompt: nothing to resample
        return [f"  served minus predicted: {m['difference']:+.3f} (one prompt: no interval; --limit 2 or more)"]
    if math.isnan(lo):
        return [f"  served minus predicted: {m['difference']:+.3f} (no resample of the prompts defines an interval)"]
    return [f"  served minus predicted: {m['difference']:+.3f} ({lo:+.3f} to {hi:+.3f}), paired 95% interval over "
            f"resampled prompts{few}"]


def format_serve_check(report: dict[str, Any]) -> str:
    """The report as text: served against predicted, the verdict, the wiring, and why they disagree."""
    how = f"sampled at temperature {report['temperature']:g}" if report.get("temperature") else "greedy"
    lines = [f"serve-check: {report['drafter']} on {report['target']}, vLLM {report['engine_version']}, "
             f"k={report['draft_tokens']}, {how}, {report['sequences']} prompt{'s' * (report['sequences'] != 1)}, "
             f"{report['tokens']} tokens generated"]
    if not report["loaded"]:
        lines.append("loaded: no (vLLM refused the draft" + (", as eyas check predicted" if report.get(
            "refusal_predicted") else "") + "; nothing was served to compare: exit 1)")
    else:
        lines += ["                     mean acc. length  acceptance by position",
                  _row("served (vLLM)", report["served"]), _row("predicted (eyas)", report["predicted"])]
        lines += _difference_lines(report.get("difference"))
        if report.get("samples"):
            lines.append(f"  the engine's tokens in the target's distribution: {_samples_text(report['samples'])}")
        if report.get("control"):
            lines.append(f"  the same engine without speculation: {_samples_text(report['control'])}")
        dc = report["drafts_compared"]
        if dc and dc["drafts"]:
            # sampled, a draft is accepted by chance, not by matching the tokens served: no length to compare
            length = "" if report.get("temperature") else \
                f", accepted length the same {dc['accepted_length_same']:.0%}"
            lines.append(f"  the engine's drafts against eyas's at the same {dc['drafts']} chain starts: first token "
                         f"the same {dc['first_token_same']:.0%}{length}")
        w = report["wiring"]
        lines.append("wiring: as the contract says" if w["agree"] else "wiring: differs from the contract")
    if report["loaded"]:
        lines.append(f"agree: {'yes' if report['agree'] else 'no'}")
    lines += [f"  - {e}" for e in report["explanation"]]
    if report.get("dump_path"):
        lines.append(f"dump: {report['dump_path']} (eyas doctor DRAFT --features {report['dump_path']})")
    return "\n".join(lines)
