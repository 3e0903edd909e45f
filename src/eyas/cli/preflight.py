"""Every verb's flags and input files checked before anything heavy runs: `check(args)`.

Loading a target takes seconds on the tiny ones and minutes on real ones, and a draft can be GBs. A
`--max-new-tokens 0`, a prompt file in the wrong encoding or an empty dump found only after that
wastes the wait and buries the one line that matters under a progress bar. So each `cmd_*` starts
with `preflight.check(args)`: its numbers are range-checked, every file it will read is opened and
read as the command will read it (prompt files in full, dumps in full, capture folders down to each
shard's header), and every place it will write is checked writable, creating nothing. Each kind of
input has one function, here or in eyas.cli.feature_inputs (captures, caches, dumps) and eyas.cli.outputs
(every place written); `VERBS` says which ones a verb needs. Bad input raises EyasError, which the CLI
prints as one `error:` and one `hint:` line (exit 2).

What needs more than the flags and files (a prompt longer than the target's context: its tokenizer; a draft
that does not fit the target: its config) is refused by the command itself, still before the weights load
(`eyas.target.Chat`: capture, generate and bench read the tokenizer first).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from eyas.cli.feature_inputs import capture_folder, data_file, existing, features, format_without_data, \
    training_capture
from eyas.cli.output import warning_said, warnings_held
from eyas.cli.outputs import apart, capture_out, draft_folder, output_file, output_folder, plot_format
from eyas.errors import EyasError, FormatError

if TYPE_CHECKING:
    from eyas.target_ref import TargetRef

# --- flags ------------------------------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def at_least(args: argparse.Namespace, minimum: int, *names: str) -> None:
    """Each named integer flag, when given, is >= minimum, and a count Python can index with (a --limit of
    2**64 crashed the slicing that reads the first N prompts)."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            raise EyasError(f"{_flag(name)} {value}: must be >= {minimum}",
                            f"pass {_flag(name)} {minimum} or more, or leave it out for the default")
        if value is not None and value > sys.maxsize:
            raise EyasError(f"{_flag(name)} {value}: must be at most {sys.maxsize}",
                            f"pass a smaller {_flag(name)}, or leave it out for the default")


def sampling(args: argparse.Namespace) -> None:
    """--temperature >= 0 and --top-p in (0, 1], both finite."""
    temperature, top_p = getattr(args, "temperature", None), getattr(args, "top_p", None)
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise EyasError(f"--temperature {temperature}: must be a number >= 0", "0 is greedy; e.g. --temperature 0.7")
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise EyasError(f"--top-p {top_p}: must be in (0, 1]", "1 keeps every token; e.g. --top-p 0.9")
    unused = []
    if top_p not in (None, 1.0):
        unused.append(f"--top-p {top_p:g}")
    if getattr(args, "top_k", 0):
        unused.append(f"--top-k {args.top_k}")
    if getattr(args, "command", None) == "generate" and args.seed is not None:  # the one unseeded by default
        unused.append(f"--seed {args.seed}")
    if not temperature and unused:  # greedy: nothing is sampled, so nothing is cut
        warning_said(f"{' and '.join(unused)} {'do' if len(unused) > 1 else 'does'} nothing at --temperature 0 "
                     "(greedy); pass a temperature to sample")


def capture_layers(args: argparse.Namespace) -> None:
    """--capture-layers is a strictly increasing list of indices >= 0, as every draft reads them and
    `eyas train` takes them (whether they fit the target is checked with it)."""
    from eyas.cli.inputs import capture_layers_of

    layers = capture_layers_of(getattr(args, "capture_layers", None))
    if layers is not None and (not layers or min(layers) < 0 or list(layers) != sorted(set(layers))):
        raise EyasError(f"--capture-layers {args.capture_layers}: indices must be >= 0 and strictly increasing",
                        "index k is the input of target layer k, e.g. --capture-layers 2,15,27")


def default_layers(args: argparse.Namespace) -> None:
    """Without --capture-layers, capture takes the engines' default (2, N//2, N-3), which a target under 7
    layers cannot have in order: said from its config, before it loads."""
    from eyas.cli.inputs import target_of
    from eyas.contract import default_capture_layers, layer_problems
    from eyas.target_ref import TargetRef

    path = target_of(args, weights=True)
    if args.capture_layers is not None or path is None:  # the embedded default has 30 layers
        return
    n = TargetRef.resolve(path, weights=False).num_layers
    problems = layer_problems(default_capture_layers(n), n)
    if problems:
        raise EyasError(f"--target {args.target}: the default capture layers (2, N//2, N-3) for {n} layers: "
                        f"{problems[0]['problem']}", f"pass --capture-layers a,b,c with 0 <= a < b < c <= {n}")


def _target_ref(args: argparse.Namespace) -> TargetRef | None:
    """The target, resolved without loading anything; None for the embedded default not yet converted
    (converting it here would hold every check after it)."""
    from eyas.cli.inputs import target_of
    from eyas.embedded import EMBEDDED_DIR, cache_dir
    from eyas.target_ref import TargetRef

    path = target_of(args, weights=True)
    if path is None:
        path = cache_dir() / EMBEDDED_DIR
        if not (path / "config.json").is_file():
            return None
    return TargetRef.resolve(path, weights=False)


def _target_config(args: argparse.Namespace) -> dict | None:
    """The target's (text) config (`_target_ref`)."""
    ref = _target_ref(args)
    return None if ref is None else ref.text_config


def answers_prompts(a: argparse.Namespace) -> bool:
    """Whether the verb answers prompts with the whole target (eval and doctor may read a cache instead)."""
    return (a.command in ("capture", "generate", "bench", "serve-check") or (a.command == "eval" and not a.data)
            or (a.command == "doctor" and bool(a.prompts)))


def answer_room(args: argparse.Namespace) -> None:
    """--max-new-tokens below the target's context: a prompt (a token at least) and its answer must fit,
    so an answer as long as the context is refused from the config, not after the weights load."""
    from eyas.target_context import decode_bound  # longrope: its original length

    value, config = getattr(args, "max_new_tokens", None), _target_config(args)
    bound, why = (None, "") if config is None else decode_bound(config)
    if isinstance(bound, int) and value is not None and value >= bound:
        raise EyasError(f"--max-new-tokens {value}: not below the target's context of {bound} tokens{why} (the "
                        "prompt and its answer must fit it)",
                        f"answer fewer tokens (e.g. --max-new-tokens {min(256, bound // 2)})")


def draft_room(args: argparse.Namespace, depths: dict[str, int | None], widths: dict[str, int | None]) -> None:
    """Drafts that fit the target: no chain, tree depth or tree budget (`depths`) of its context's length
    or more, no branching (`widths`) past its vocabulary. Said before anything loads: a 10^8-token chain
    was a traceback from allocating terabytes of KV cache, minutes in."""
    from eyas.target_context import decode_context

    config = _target_config(args)
    if config is None:
        return
    for limits, bound, what in ((depths, decode_context(config), "context"),
                                (widths, config.get("vocab_size"), "vocabulary")):
        for flag, value in limits.items():
            if isinstance(bound, int) and value is not None and value >= bound:
                example = "--tree 5,4,16" if flag.startswith("--tree ") else f"{flag} 5"
                raise EyasError(f"{flag} {value}: not below the target's {what} of {bound} tokens",
                                f"draft fewer: EAGLE-3 drafts a few tokens a step (e.g. {example})")


SEED_RANGE = (0, 2**63 - 1)  # what torch's generators take; eyas derives its other seeds inside it


def seed(args: argparse.Namespace) -> None:
    """--seed, where the verb has one, is in SEED_RANGE."""
    value = getattr(args, "seed", None)
    if value is not None and not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise EyasError(f"--seed {value}: must be from {SEED_RANGE[0]} to 2**63-1", "e.g. --seed 0")


def one_decoding(args: argparse.Namespace) -> None:
    """`eyas generate` decodes one way: a chain (--draft-tokens) or a tree (--tree), not both."""
    if args.draft_tokens is not None and args.tree is not None:
        raise EyasError(f"--draft-tokens {args.draft_tokens} and --tree {args.tree} both given",
                        "pass --draft-tokens K for a chain or --tree D,K,N for a tree (eyas bench measures both)")


# --- files read ---------------------------------------------------------------------------------------


def drafter(args: argparse.Namespace) -> None:
    """DRAFTER, where given, exists (the shipped one is checked where it is resolved, with the target)."""
    if getattr(args, "drafter", None) not in (None, "default"):
        existing(args.drafter, "DRAFTER")


def target(args: argparse.Namespace, *, weights: bool) -> None:
    """--target: a folder or config that exists, with weights beside it where the verb runs it (every
    weight, and a chat tokenizer, where it answers prompts: `answers_prompts`), and --device: one this machine has
    (`eyas.cli.inputs.target_of` checks both)."""
    from eyas.cli.inputs import target_of
    from eyas.target_ref import TargetRef

    path = target_of(args, weights=weights)
    ref = TargetRef.resolve(path, weights=False) if path is not None else None
    if ref is not None:
        ref.logit_map()  # refuses a logit scale or softcap its class cannot use, before the weights are read
    ref = ref if answers_prompts(args) else None
    foreign = ref.foreign_decoder() if ref is not None else None
    if foreign:
        raise EyasError(f"--target {args.target}: {foreign}", "use a Llama-style target (Llama, Qwen2/3, Mistral, "
                        "Gemma, Phi-3, ...: decoder layers under model.layers, a final model.norm)")
    why = ref.missing_model() if ref is not None else None
    if why:
        cache = {"eval": "--data CACHE", "doctor": "--features CACHE"}.get(args.command)
        raise EyasError(f"--target {args.target}: eyas {args.command} runs the target, but {why}",
                        "pass the complete model folder" + (f", or {cache}: a feature cache is judged from the final "
                                                            "norm and lm_head alone" if cache else ""))
    chat = ref.missing_chat() if ref is not None else None
    if chat:
        raise EyasError(f"--target {args.target}: eyas {args.command} answers prompts as a chat model's assistant "
                        f"turn, but {chat}", "point --target at an instruct model's folder, with its tokenizer files")


def prompts(source: str | None, *, limit: int | None = None) -> None:
    """A prompt file read in full (encoding, records) or a named set that is installed."""
    from eyas.data.prompts import check_prompts

    if source is not None:
        check_prompts(source, limit=limit)


def bench_prompts(names: str | None) -> None:
    """`eyas bench --prompts`: named sets or prompt files, joined by commas."""
    from eyas.bench.prompts import PROMPT_SETS, prompt_names

    for name in prompt_names(names or "mtbench"):
        if name not in PROMPT_SETS:
            try:
                prompts(name)
            except FormatError as e:  # not a file: its hint lists capture's prompt sources, not bench's sets (a
                if Path(name).is_file():  # file's says how to mend its content: its encoding, its records)
                    raise
                raise FormatError(str(e), f"pass a .jsonl of {{prompt, category}}, or one of bench's sets: "
                                          f"{', '.join(PROMPT_SETS)}") from None


def verifier_name(name: str | None) -> None:
    """`convert` / `init --verifier-name`: an id engines can load (vLLM serves the draft's recorded verifier)."""
    if name is not None and not name.strip():
        raise EyasError("--verifier-name is empty", "give the target's hub id, e.g. --verifier-name "
                        "HuggingFaceTB/SmolLM2-135M-Instruct, or leave the flag out to keep the recorded one")


def train_run(args: argparse.Namespace) -> None:
    """`eyas train`: the target, the settings, every capture folder, the warm start, the run folder."""
    from eyas.train import config_from_args
    from eyas.train.checkpoint import RunFiles, refuse_old_run, resumable
    from eyas.train.config import check_config, data_folders

    target(args, weights=True)
    config = config_from_args(args)
    check_config(config, flags=True)
    for folder in data_folders(config):
        training_capture(folder)
    init = None
    if config.init:
        from eyas.drafter_loading import resolve_drafter

        try:  # "default": the shipped draft, as eval --against reads it
            init = resolve_drafter(config.init, args.target)
        except EyasError:
            raise EyasError(f"--init default: eyas ships no draft for the target {args.target}",
                            "--init default is the draft eyas ships for the target (SmolLM2-135M-Instruct only); "
                            "pass a draft folder") from None
        existing(init, "--init")
    output_folder(config.out, "--out")
    apart(config.out, "--out", {"--target": args.target, "--init": init,
                                **{f"--data {f}": f for f in data_folders(config)}})
    if config.resume:
        resumable(RunFiles.of(config.out))
    else:
        refuse_old_run(RunFiles.of(config.out))


# --- the verbs ----------------------------------------------------------------------------------------


def _capture(a: argparse.Namespace) -> None:
    at_least(a, 0, "skip")
    at_least(a, 1, "limit", "max_new_tokens", "batch_size")
    at_least(a, 2, "max_length")
    sampling(a)
    capture_layers(a)
    target(a, weights=True)
    prompts(a.prompts, limit=None if a.limit is None else min(a.skip + a.limit, sys.maxsize))
    # an input is named as one before it is refused for holding other files
    apart(a.out, "--out", {"--target": a.target, "--prompts": a.prompts}, resumes=True)
    capture_out(a.out)
    default_layers(a)
    resumed_capture(a)


def resumed_capture(a: argparse.Namespace) -> None:
    """A capture into a folder holding one resumes it only under the same plan: what the flags and the
    target's config decide (target, layers, dtype, answer length) is compared here, before the target loads;
    the prompts' digest once they are read (eyas.data.capturing.same_prompts, still before), the rest (the chat
    template, the context, the weights' digest) once it has."""
    from eyas.cli.inputs import capture_layers_of
    from eyas.contract import default_capture_layers
    from eyas.data.capturing import plan_head, shard_size_for
    from eyas.data.shards import MANIFEST, generation_settings, read_manifest, same_plan
    from eyas.dtypes import to_dtype

    path = Path(a.out) / MANIFEST
    ref = _target_ref(a) if path.is_file() else None
    if ref is None:
        return
    old = read_manifest(Path(a.out))
    layers = capture_layers_of(a.capture_layers) or default_capture_layers(ref.num_layers)
    plan = plan_head(ref, layers, to_dtype(a.dtype))
    # not max_length: the capture records the context transformers' config reads, which may be its class default
    answers = {"max_new_tokens": a.max_new_tokens, "skip_long": a.skip_long,
               **generation_settings(a.temperature > 0, a.temperature, a.top_p, 0, a.seed)}
    then = old.get("generation") or {}
    # greedy records do_sample and temperature alone: those two say greedy against sampled, not three nulls more
    keys = [k for k in answers if k in then or k in ("max_new_tokens", "skip_long")]
    shards = "shard_size (--batch-size)"
    same_plan({**old, shards: old.get("shard_size"), **{f"generation.{k}": then.get(k) for k in keys}},
              {**plan, shards: shard_size_for(a.batch_size), **{f"generation.{k}": answers[k] for k in keys}}, path)


def _eval(a: argparse.Namespace) -> None:
    if a.data and a.prompts:
        raise EyasError("--data and --prompts both given", "evaluate on stored shards OR on prompts, not both")
    at_least(a, 1, "limit", "max_new_tokens", "depth", "tree_top_k", "tree_depth")
    sampling(a)
    target(a, weights=True)
    draft_room(a, {"--depth": a.depth, "--tree-depth": a.tree_depth}, {"--tree-top-k": a.tree_top_k})
    if a.data:
        if a.max_new_tokens is not None:
            warning_said(f"--max-new-tokens {a.max_new_tokens} does nothing with --data: eval measures the "
                         "cache's samples whole (the doctor cuts them)")
        capture_folder(a.data, "--data", getattr(a, "data_format", None))
        if Path(a.data).is_file():
            data_file(a.data, a.target, getattr(a, "data_format", None))
        if a.temperature:  # a cache with no last hidden state
            from eyas.data.caches import open_cache
            from eyas.sampled import require_sampleable

            require_sampleable(open_cache(a.data, format=getattr(a, "data_format", None)).info)
    else:
        format_without_data(getattr(a, "data_format", None), "--data")
        prompts(a.prompts, limit=a.limit)
    if a.against not in (None, "default"):
        existing(a.against, "--against")
    output_file(a.plot, "--plot")
    apart(a.plot, "--plot", {"DRAFTER": a.drafter, "--target": a.target, "--data": a.data, "--prompts": a.prompts,
                             "--against": a.against})
    plot_format(a.plot)  # after: a plot over an input is named as that


def _decoding(a: argparse.Namespace) -> None:
    from eyas.draft_shape import parse_tree

    at_least(a, 1, "max_new_tokens", "draft_tokens", "limit")
    at_least(a, 0, "top_k")
    sampling(a)
    shape = parse_tree(a.tree, "--tree") or (None, None, None)
    target(a, weights=True)
    draft_room(a, {"--draft-tokens": a.draft_tokens, "--tree depth": shape[0], "--tree budget": shape[2]},
               {"--tree top_k": shape[1]})
    if (ref := _target_ref(a)) and (why := ref.undecodable()):  # linear attention, Mamba: before the load
        raise EyasError(f"--target {a.target}: {why}", "measure the draft on captured features: eyas eval DRAFTER "
                        "--target T --data CACHE (SpecForge's, speculators' or eyas capture's)")


def _generate(a: argparse.Namespace) -> None:
    from eyas.data.prompts import blank, not_unicode

    if blank(a.prompt):  # as a prompt file's blank record is refused: an answer to nothing measures nothing
        raise EyasError("--prompt is empty", "pass the user turn to answer, e.g. --prompt 'Explain KV caches'")
    bad = not_unicode(a.prompt)  # bytes that are not UTF-8 reach argv as lone surrogates
    if bad is not None:
        raise EyasError(f"--prompt: {bad}", "pass the prompt as UTF-8 text (or put it in a prompt file)")
    one_decoding(a)
    _decoding(a)


def _bench(a: argparse.Namespace) -> None:
    _decoding(a)
    bench_prompts(a.prompts)
    output_file(a.plot, "--plot")
    apart(a.plot, "--plot", {"DRAFTER": a.drafter, "--target": a.target,
                             **{f"--prompts {n}": n for n in a.prompts.split(",")}})
    plot_format(a.plot)


def _doctor(a: argparse.Namespace) -> None:
    at_least(a, 1, "limit", "max_new_tokens")
    if a.prompts and a.features and Path(a.features).is_dir():
        raise EyasError(f"--prompts and --features {a.features} (a feature cache) both given: the doctor measures "
                        "the cache's own samples", "drop --prompts (an engine dump file takes --prompts: the wirings "
                        "are measured on their answers)")
    target(a, weights=True)
    prompts(a.prompts, limit=a.limit)
    features(a)


def _serve_check(a: argparse.Namespace) -> None:
    at_least(a, 1, "limit", "draft_tokens")
    at_least(a, 2, "max_new_tokens")
    sampling(a)
    target(a, weights=True)
    draft_room(a, {"--draft-tokens": a.draft_tokens}, {})
    prompts(a.prompts, limit=a.limit)
    output_file(a.dump, "--dump")
    apart(a.dump, "--dump", {"DRAFTER": a.drafter, "--target": a.target, "--prompts": a.prompts})
    if a.dump is not None and not str(a.dump).endswith(".safetensors"):  # a notes.txt was silently replaced
        raise EyasError(f"--dump {a.dump}: the dump is a safetensors file, and this name says otherwise",
                        "end it in .safetensors (eyas doctor --features reads it)")


VERBS: dict[str, Callable[[argparse.Namespace], None]] = {
    "capture": _capture,
    "eval": _eval,
    "train": train_run,
    "generate": _generate,
    "bench": _bench,
    "doctor": _doctor,
    "serve-check": _serve_check,
    "init": lambda a: (capture_layers(a), target(a, weights=True), verifier_name(a.verifier_name),
                       draft_folder(a.dst, a.force, {"--target": a.target})),
    "convert": lambda a: (existing(a.src, "SRC"), verifier_name(a.verifier_name),
                          draft_folder(a.dst, a.force, {"--target": a.target, "SRC": a.src})),
}


def check(args: argparse.Namespace) -> None:
    """The one call at the top of every `cmd_*`: refuse bad flags and inputs before any model loads."""
    verb = VERBS.get(args.command)
    if verb is None:
        return
    with warnings_held():  # a refusal is one error line: the warnings said before it are dropped
        seed(args)
        drafter(args)
        verb(args)
        if answers_prompts(args):  # last: the other checks name what they find first
            answer_room(args)
