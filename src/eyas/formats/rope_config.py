"""How a config states its rope, read into the contract: theta and scaling under transformers 4's
names (rope_theta, rope_scaling) or 5's (rope_parameters), which of them wins where they differ, and
the rope kinds eyas's drafter cannot turn (eyas.rope says how it turns the others).

Hunyuan's NTK-alpha (`dynamic` with `alpha`, AngelSlim's hunyuan drafts) raises the base the rope
turns at. Serving engines apply it (vLLM and SGLang's DynamicNTKAlphaRotaryEmbedding), and so does
the drafter; transformers' Llama rope ignores `alpha` (its dynamic rope reads `factor` only, and
requires it), so a draft trained on a Llama rope was trained at the plain base: a warning says so,
with the base each reading gives.
"""

from __future__ import annotations

import math

from eyas.contract import DEFAULT_ROPE_THETA
from eyas.formats.parsed import Parsed
from eyas.formats.values import refuse, rope_base, rope_dict, show
from eyas.rope import ROPE_TYPES, alpha_base


# what each rope kind cannot be built without (transformers, vLLM and the drafter all fail on it)
_NEEDS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def read_rope(p: Parsed, src: dict, where: str) -> None:
    """rope_theta / rope_scaling (transformers 4) or rope_parameters (transformers 5); None when absent."""
    params = src.get("rope_parameters")
    params = {} if params is None else rope_dict(p.file, f"{where}rope_parameters", params)
    p_scaling = _scaling({k: v for k, v in params.items() if k != "rope_theta"})
    theta = p.read(src, "rope_theta", rope_base, where=where, default=None)
    if theta is None and params.get("rope_theta") is not None:
        theta = float(params["rope_theta"])
        p.set("rope_theta", theta, f"{p.file}: {where}rope_parameters.rope_theta")
    elif theta is not None and params.get("rope_theta") not in (None, theta):
        p.warn(
            "rope_theta_conflict",
            f"{where}rope_parameters.rope_theta",
            f"{p.file}: {where}rope_theta {theta} and rope_parameters.rope_theta {params['rope_theta']} differ; "
            "eyas uses rope_theta",
            "make them agree: transformers 5 reads rope_parameters, transformers 4 rope_theta",
        )
    scaling = src.get("rope_scaling")
    if scaling is not None:
        scaling = _scaling(rope_dict(p.file, f"{where}rope_scaling", scaling))
    if scaling and p_scaling and rope_kind(scaling) != rope_kind(p_scaling):
        p.warn(
            "rope_scaling_conflict",
            f"{where}rope_parameters",
            f"{p.file}: {where}rope_scaling is {rope_kind(scaling)!r} but rope_parameters is "
            f"{rope_kind(p_scaling)!r}; eyas uses rope_scaling",
            "make them agree: transformers 5 reads rope_parameters, transformers 4 rope_scaling",
        )
    if scaling:
        p.set("rope_scaling", scaling, f"{p.file}: {where}rope_scaling")
    elif p_scaling:
        p.set("rope_scaling", p_scaling, f"{p.file}: {where}rope_parameters")
    else:
        stated = "rope_scaling" in src or bool(params)
        said = "plain rope" if stated else "absent"
        p.set("rope_scaling", None, f"none ({where}rope_scaling {said})", assumed=not stated)
    _runnable(p, p.fields["rope_scaling"] or {}, where)


def _runnable(p: Parsed, used: dict, where: str) -> None:
    """Name a rope the drafter cannot turn as an unrunnable part; check and explain NTK-alpha."""
    kind = rope_kind(used)
    if kind == "mrope" or "mrope_section" in used:  # 3-D positions (engines build them from
        # mrope_section under any rope type): the drafter has 1-D rope only
        p.unrunnable.append(f"multimodal rope (rope type {kind!r}, mrope_section {show(used.get('mrope_section'))})")
    elif kind not in ROPE_TYPES:
        p.unrunnable.append(f"rope type {kind!r} (the drafter turns {', '.join(ROPE_TYPES)})")
    elif missing := [k for k in _NEEDS.get(kind, ()) if used.get(k) is None]:
        raise refuse(p.file, f"{where}rope_scaling.{missing[0]}", None,
                     f"a number: rope type {kind!r} needs {', '.join(_NEEDS[kind])} (copy them from the target's "
                     "config)")
    elif kind == "dynamic" and used.get("alpha") is not None:
        _alpha(p, float(used["alpha"]), where)


def _alpha(p: Parsed, alpha: float, where: str) -> None:
    """The base NTK-alpha gives, refused where it is no number; warned, with the base each reading turns at."""
    theta, dim = p.fields["rope_theta"] or DEFAULT_ROPE_THETA, p.fields["head_dim"]
    if dim <= 2:
        raise refuse(p.file, f"{where}head_dim", dim, "more than 2 under rope_scaling alpha (theta*alpha^(d/(d-2)))")
    try:
        base = alpha_base(theta, alpha, dim)
    except OverflowError:
        base = math.inf
    if not math.isfinite(base) or base <= 1:  # the base rope_theta must be (eyas.formats.values.rope_base)
        raise refuse(p.file, f"{where}rope_scaling.alpha", alpha,
                     "a factor that keeps the base theta*alpha^(d/(d-2)) finite and above 1")
    p.warn(
        "rope_alpha",
        f"{where}rope_scaling.alpha",
        f"{p.file}: rope_scaling dynamic with alpha {alpha:g}: the drafter turns at base {theta:g}*{alpha:g}^"
        f"({dim}/{dim - 2}) = {base:.4g}, as serving engines build it; transformers' Llama rope ignores alpha "
        f"(turns at {theta:g}), and so does AngelSlim's trainer: a draft trained without alpha is served at "
        "other frequencies than it learned",
        "keep alpha only if the draft was trained with it; else remove rope_scaling (plain rope at rope_theta)",
    )


def rope_kind(scaling: dict) -> str:
    """A rope scaling's type, under either key transformers reads."""
    return scaling.get("rope_type", scaling.get("type", "default"))


def _scaling(scaling: dict) -> dict:
    """A rope_scaling / rope_parameters dict without the theta; {} for plain rope (type default, nothing else)."""
    return {} if rope_kind(scaling) == "default" and set(scaling) <= {"rope_type", "type"} else scaling
