"""The one grammar of `eyas`: every verb's flags, built from shared helpers so a flag means the same
thing, with the same help and choices, wherever it appears.

- `--target` is a target folder or a config file; omitted, it is the embedded default (for check,
  inspect and convert, which only compare configs: no target).
- DRAFTER, the optional positional of every verb that reads a draft, defaults to the draft eyas
  ships for the target.
- `--format` names the on-disk format written; `--dtype` takes eyas's, vLLM's and transformers'
  names; `--layer-convention` on every verb that reads a draft's config; `--json` prints one JSON
  object on stdout; `--no-progress` turns off the progress bar on stderr.

Building the parser loads no model code (no doctor, bench, generate or transformers): each `cmd_*`
imports what it runs. It reads only the flag vocabularies: eyas.dtypes, eyas.formats, the answering
engines (eyas.data.answers), and TrainConfig's fields with their docs (eyas.train), which become
`eyas train`'s flags.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from eyas.check.consumers import CONSUMERS
from eyas.cli.checkpoint import cmd_check, cmd_convert, cmd_init, cmd_inspect
from eyas.cli.decoding import cmd_bench, cmd_generate
from eyas.cli.doctor import cmd_doctor
from eyas.cli.engines import cmd_serve_check
from eyas.cli.examples import EXAMPLES
from eyas.cli.output import warning_said
from eyas.cli.measure import cmd_capture, cmd_eval, cmd_train
from eyas.data.answers import ANSWER_ENGINES
from eyas.dtypes import AUTO, choices
from eyas.formats import FORMATS, LAYER_CONVENTIONS
from eyas.train import add_arguments as add_train_arguments

# eyas.doctor's DEFAULT_LIMIT and DEFAULT_MAX_NEW_TOKENS (importing it here would load the harness for
# `eyas --help`; tests/test_cli_verbs.py holds the two equal)
DOCTOR_LIMIT, DOCTOR_MAX_NEW_TOKENS = 8, 64

WRITE_FORMATS = (*FORMATS, "both")
# what --data-format names (eyas.data.caches reads them; listed here so building the parser loads no reader)
CACHE_FORMATS = ("eyas", "eyas-dump", "specforge", "speculators", "speculators-legacy", "modelopt")
# capture, eval, generate and bench run in bf16 or fp32; every spelling of those two is accepted
RUN_DTYPE_CHOICES = choices((torch.bfloat16, torch.float32))
DEFAULT_TARGET = "the embedded SmolLM2-135M-Instruct"

# --- shared flags -------------------------------------------------------------------------------


def add_drafter(p: argparse.ArgumentParser, what: str = "the draft folder, any format") -> None:
    p.add_argument("drafter", nargs="?", metavar="DRAFTER",
                   help=f"{what} (default: the draft eyas ships for the target)")


def add_target(p: argparse._ActionsContainer, *, use: str | None = None) -> argparse.Action:
    """`--target`; `use` says what a verb that only reads the target's config does with it (such a
    verb reads the draft alone without one), None for the verbs that run the target."""
    if use is None:
        help_ = (f"the target: its model folder, or the config.json inside it (default: {DEFAULT_TARGET}); "
                 "never downloaded")
    else:
        help_ = f"the target's folder or a config .json: {use} (default: none; 'default' = {DEFAULT_TARGET})"
    return p.add_argument("--target", metavar="DIR_OR_CONFIG", help=help_)


def add_layer_convention(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layer-convention",
        choices=LAYER_CONVENTIONS,
        help="how to read nested eagle_config layer ids: input = capture indices, output = output of layer i (+1); "
        "default: as current SGLang (+1 only when the first id is 1)",
    )


def add_json(p: argparse.ArgumentParser, what: str = "the report") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object on stdout")


def add_verifier_name(p: argparse.ArgumentParser) -> None:
    """The hub id a written draft records as its verifier, where --target is a local folder (a local path
    makes the draft not portable: `eyas check` says so)."""
    p.add_argument("--verifier-name", metavar="ID",
                   help="the target's hub id to record as the verifier (vLLM serves it)")


def add_progress(p: argparse.ArgumentParser, *, bar: bool = True) -> None:
    """`--no-progress` on every verb, so one script passes it to all; `bar`: the verb shows one."""
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr" if bar else "no progress lines on stderr")


def add_reading(p: argparse.ArgumentParser, *, progress: bool, what: str = "the report") -> None:
    """The tail of every verb that reads a draft: how to read its layer ids, and how to report."""
    add_layer_convention(p)
    add_json(p, what)
    add_progress(p, bar=progress)


def add_dtype(p: argparse.ArgumentParser, what: str, *, auto: str | None = None) -> None:
    """`--dtype`; `auto` (generate, bench, eval) says what "auto", then the default, picks."""
    if auto:  # any case, as eyas.dtypes reads a dtype's name
        p.add_argument("--dtype", type=str.lower, choices=(AUTO, *RUN_DTYPE_CHOICES), default=AUTO,
                       help=f"{what}: auto = {auto} (default: auto)")
    else:
        p.add_argument("--dtype", type=str.lower, choices=RUN_DTYPE_CHOICES, default="bf16",
                       help=f"{what} (default: bf16)")


def add_device(p: argparse.ArgumentParser, what: str = "the target and the draft run on") -> None:
    p.add_argument("--device", metavar="DEV",
                   help=f"torch device {what}: cpu, cuda or cuda:N; cuda spreads a target too large for one "
                   "GPU over all of them (default: cpu)")


def add_format(p: argparse.ArgumentParser | argparse._ActionsContainer, **kw) -> argparse.Action:
    return p.add_argument("--format", choices=WRITE_FORMATS, **kw,
                   help="format to write; both = config.json (speculators) + config_eagle.json (eagle)"
                   + (f" (default: {kw['default']})" if "default" in kw else ""))


def add_data_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-format", choices=CACHE_FORMATS,
                   help="the feature cache's format (default: detected from its files)")


def add_capture_layers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--capture-layers", metavar="K,K,K",
                   help="capture indices, k = the input of target layer k (default: 2, N//2, N-3)")


def add_max_new_tokens(p: argparse.ArgumentParser, default: int, what: str) -> None:
    p.add_argument("--max-new-tokens", type=int, default=default, metavar="N", help=f"{what} (default: {default})")


def add_decoding(p: argparse.ArgumentParser) -> None:
    """The decoding shape and budget shared by generate and bench."""
    p.add_argument("--draft-tokens", type=int, metavar="K", help="a chain of K draft tokens per step")
    p.add_argument("--tree", metavar="D,K,N", help="a dynamic tree: depth, top-k per level, draft-node budget")
    add_max_new_tokens(p, 256, "answer tokens per prompt")
    add_dtype(p, "weights and compute of target and draft",
              auto="the dtype this target decodes fastest in on this machine, measured once and cached")
    add_device(p)


# --- renamed flags -------------------------------------------------------------------------------


class _DeprecatedAlias(argparse.Action):
    """An old flag name: stores into the new flag's destination and says once, on stderr, what to use."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        warning_said(f"{option_string} is deprecated; use {self.new}")
        setattr(namespace, self.dest, values)


def add_deprecated_alias(p: argparse._ActionsContainer, old: str, new: argparse.Action) -> None:
    """Keep `old` working as another name of the flag `new` (same destination, type and choices) for a
    release: a script written against the last release runs, with one stderr line naming the new flag.
    The alias is hidden from --help; the README's command list names it as deprecated.

    A required flag gets its alias through a required mutually exclusive group holding both (argparse then
    accepts either and refuses both), e.g. `g = p.add_mutually_exclusive_group(required=True)`.
    """
    p.add_argument(old, action=_DeprecatedAlias, new=new.option_strings[0], dest=new.dest, type=new.type,
                   choices=new.choices, metavar=new.metavar, help=argparse.SUPPRESS)


# --- the verbs ----------------------------------------------------------------------------------


def _checkpoint_verbs(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("inspect", cmd_inspect, "config files and formats, the contract, tensors, what each engine will do, "
                "problems and warnings; exit 0, 1 when a tensor misfits or the config files disagree on what it computes "
                "(check's problems with the draft as read), 2 unreadable")
    add_drafter(p, "a draft folder, or a single draft config .json (tensor checks skipped)")
    named = p.add_mutually_exclusive_group()  # --target, or its old name --verifier-config
    target = add_target(named, use="its depth resolves the default capture layers, its facts fill the verifier")
    add_deprecated_alias(named, "--verifier-config", target)
    add_reading(p, progress=False)

    p = command("check", cmd_check, "every problem with a draft, offline; exit 0 clean, 1 problems, 2 unreadable")
    add_drafter(p, "a draft folder, or a single draft config .json")
    add_target(p, use="the draft's vocab, width, depth and context are checked against it")
    p.add_argument("--engine", choices=CONSUMERS, help="the engine that will serve the draft: where it would "
                   "wire the draft otherwise than its contract says, or refuse it, that is a problem (exit 1), "
                   "not a warning (default: none: where an engine would wire it otherwise, a warning; "
                   "inspect shows what each engine loads)")
    add_reading(p, progress=False)

    p = command("convert", cmd_convert, "rewrite a draft as speculators, eagle or both formats (lossless)")
    p.add_argument("src", metavar="SRC", help="the draft folder to read ('default': the draft eyas ships for the "
                   "target)")
    p.add_argument("dst", metavar="DST", help="the folder to write (must be empty or new, unless --force)")
    required = p.add_mutually_exclusive_group(required=True)  # --format, or its old name --to
    add_deprecated_alias(required, "--to", add_format(required))
    named = p.add_mutually_exclusive_group()
    target = add_target(named, use="where the draft names no verifier, its name and architectures are recorded "
                        "as one; the copy is checked against it, as check --target does")
    add_deprecated_alias(named, "--verifier-config", target)
    add_verifier_name(p)
    p.add_argument("--force", action="store_true", help="replace a DST that holds a draft and nothing else")
    add_reading(p, progress=False)

    p = command("init", cmd_init, "write a fresh (random) draft whose contract fits a target")
    p.add_argument("dst", help="the folder to write")
    add_target(p)
    add_capture_layers(p)
    add_format(p, default="both")
    add_verifier_name(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    p.add_argument("--force", action="store_true", help="replace a DST that holds a draft and nothing else")
    add_json(p)
    add_progress(p, bar=False)


def _feature_verbs(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("capture", cmd_capture, "answer prompts with the target and store its features as shards")
    p.add_argument("--prompts", default="sharegpt",
                   help="a prompt file (.json/.jsonl ShareGPT or {prompt}, or text lines), or sharegpt / mtbench, or "
                   "sharegpt-clean (first turns without evaluation-set copies) / sharegpt-turns (later turns, in "
                   "their conversation) (default: sharegpt)")
    p.add_argument("--out", required=True, help="the shard folder (resumable: finished shards are kept)")
    add_target(p)
    add_capture_layers(p)
    p.add_argument("--limit", type=int, metavar="N", help="use N prompts (after --skip)")
    p.add_argument("--skip", type=int, default=0, metavar="N",
                   help="leave out the first N prompts (split one source across captures run in parallel)")
    add_max_new_tokens(p, 256, "answer tokens per prompt")
    p.add_argument("--batch-size", type=int, default=8, metavar="B", help="prompts answered together (default: 8)")
    add_dtype(p, "weights and stored features")
    add_device(p, "the target runs on")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy answers (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling when --temperature > 0 (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--max-length", type=int, metavar="N",
                   help="prompt + answer token limit (default: the target's context)")
    p.add_argument("--skip-long", action="store_true", help="skip prompts that do not fit instead of failing")
    p.add_argument("--answers", choices=ANSWER_ENGINES, default="eyas",
                   help="who generates the answers: eyas's batched loop (Llama-family targets; others use generate) "
                   "or transformers' generate (default: eyas)")
    add_json(p, "the manifest")
    add_progress(p)

    p = command("eval", cmd_eval, "measure a draft standalone: per-depth acceptance, chain and tree tau, coverage")
    add_drafter(p)
    p.add_argument("--data", metavar="CACHE",
                   help="stored features: an eyas capture folder or another trainer's cache (SpecForge, "
                   "speculators, ModelOpt, ...: see --data-format; detected)")
    add_data_format(p)
    p.add_argument("--prompts", help="a prompt file, or a packaged set: mtbench (default when --data is not given), "
                   "sharegpt, sharegpt-clean, sharegpt-turns")
    add_target(p)
    add_device(p)
    p.add_argument("--limit", type=int, metavar="N", help="use the first N prompts or samples")
    p.add_argument("--max-new-tokens", type=int, metavar="N",  # None: the library's, and said unused with --data
                   help="answer tokens per prompt (default: 256; --data samples are measured whole)")
    p.add_argument("--depth", type=int, default=8, help="draft depths to measure, tau for k = 1..depth (default: 8)")
    p.add_argument("--tree-top-k", type=int, default=4, metavar="K", help="tree branching per level (default: 4)")
    p.add_argument("--tree-depth", type=int, default=5, metavar="D", help="tree depth (default: 5)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="also the expected acceptance when serving samples at this temperature (sampled chain, "
                   "argmax draft, tree); --prompts are then answered sampled at it, seed 0 (default: 0, greedy only)")
    add_dtype(p, "weights and compute of target and draft",
              auto="bf16 on a GPU or a CPU with bf16 dot products (avx512_bf16, AMX), fp32 elsewhere")
    p.add_argument("--against", metavar="DRAFTER",
                   help="a second draft (a folder, or default: the shipped one) measured on the same samples: "
                   "its figures, and this draft's minus its with 95%% intervals (the sampled ones too, with "
                   "--temperature)")
    p.add_argument("--plot", metavar="PNG", help="write acceptance by depth and tau vs k as a PNG")
    add_reading(p, progress=True)

    p = command("train", cmd_train, "train an EAGLE-3 draft on captured features (training-time test)")
    add_train_arguments(p)  # TrainConfig's fields, with their docs as help
    add_json(p, "the summary")


def _decoding_verbs(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("generate", cmd_generate, "answer a prompt with speculative decoding, streaming the text")
    add_drafter(p)
    p.add_argument("--prompt", required=True, help="the user turn (the chat template is applied)")
    add_target(p)
    add_decoding(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling when --temperature > 0 (default: 1)")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling when --temperature > 0; 0 = off (default)")
    p.add_argument("--seed", type=int, help="sampling seed (default: unseeded)")
    add_reading(p, progress=True, what="the answer and its statistics (no streaming)")

    p = command("bench", cmd_bench, "time HF greedy, HF prompt lookup, eyas target, chain and tree on the same prompts")
    add_drafter(p)
    p.add_argument("--prompts", default="mtbench",
                   help="mtbench, humaneval, copy, a .jsonl of {prompt, category}, or a comma-separated list "
                   "(default: mtbench)")
    p.add_argument("--limit", type=int, metavar="N", help="N prompts, spread over the categories")
    add_target(p)
    add_decoding(p)
    p.add_argument("--sweep", action="store_true",
                   help="try chain lengths and tree shapes; remember the fastest (with --dtype auto, time the "
                   "dtypes anew too)")
    p.add_argument("--plot", metavar="PNG", help="speedup per method and prompt category")
    add_reading(p, progress=True)

    p = command("doctor", cmd_doctor, "name the wiring fault behind a low acceptance, and the fix; exit 1 if faulty")
    add_drafter(p)
    add_target(p)
    p.add_argument("--prompts", help="prompts to answer and measure on (default: MT-bench; not with a cache)")
    p.add_argument("--features", metavar="DUMP_OR_CACHE",
                   help="an engine dump (safetensors: input_ids [T], features [T, W]) or a trainer's feature cache "
                   "(a folder: eyas, SpecForge, speculators, ... as --data-format lists; measured on instead of "
                   "answers), matched against the target's own states")
    add_data_format(p)
    add_device(p)
    p.add_argument("--limit", type=int, metavar="N",
                   help=f"prompts, or a cache's samples, measured (default: {DOCTOR_LIMIT}; up to 4x as many where "
                   "positions and answers disagree)")
    add_max_new_tokens(p, DOCTOR_MAX_NEW_TOKENS, "answer tokens per prompt, or per cache sample where the "
                       "target's full weights run (with its head alone, a cache is measured whole, as eval does)")
    add_reading(p, progress=True)

    p = command("serve-check", cmd_serve_check, "serve the draft in a real engine (vLLM, CPU) and compare its "
                "acceptance and wiring with eyas's prediction; exit 1 if they disagree or vLLM refuses the draft")
    add_drafter(p)
    p.add_argument("--engine", choices=("vllm",), default="vllm",
                   help="the engine (installed by scripts/install-engines.sh; default: vllm)")
    add_target(p)
    p.add_argument("--prompts", default="mtbench", help="a prompt file, or a packaged set: mtbench (default), "
                   "sharegpt, sharegpt-clean, sharegpt-turns")
    p.add_argument("--limit", type=int, metavar="N", help="prompts served (default: 10)")
    p.add_argument("--draft-tokens", type=int, default=5, metavar="K", help="draft tokens per step (default: 5)")
    add_max_new_tokens(p, 64, "answer tokens per prompt")
    p.add_argument("--dump", metavar="PATH",
                   help="write what the engine fed the draft (eyas dump format, for `eyas doctor --features`)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="serve samples at this temperature (request i with seed i): acceptance is held against "
                   "its expectation on the engine's own steps, and the tokens against the target's "
                   "distribution (default: 0, greedy)")
    add_device(p, "eyas's replay of the served tokens runs on (vLLM itself runs on the CPU)")
    add_json(p)
    add_progress(p)


class _Parser(argparse.ArgumentParser):
    """argparse's usage errors in eyas's shape, as every other error: one `error: PROG: ...` line (a flag
    the verb lacks is reported by the verb's parser, not the top level's), a `hint:` line, exit 2. No usage
    block: eval's is nine lines above the one that matters, and the hint names `--help`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.verbs: dict[str, argparse.ArgumentParser] = {}  # the top level's: each verb's own parser
        # a negative number in exponent form (--lr -1e-3) is a value, as -0.001 is: argparse took it for a flag
        # ("expected one argument") and never reached the flag's own check
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            verb = self.verbs.get(getattr(ns, "command", None), self)
            # the verb's own flag left over was given before the verb (`eyas --json check`): say where it goes
            early = [x for x in extra if x.split("=")[0] in verb._option_string_actions and verb is not self]
            where = f" ({', '.join(early)}: a flag of `{verb.prog}`, given before the verb: put it after)" \
                if early else ""
            verb.error(f"unrecognized arguments: {' '.join(extra)}{where}")
        return ns

    def error(self, message: str) -> NoReturn:
        hint = f"`{self.prog} --help` lists {'the verbs' if self.verbs else 'its flags and their values'}"
        print(f"error: {self.prog}: {message}\nhint: {hint}", file=sys.stderr)
        raise UsageError(f"{self.prog}: {message}", hint)


class UsageError(SystemExit):
    """A usage error argparse found (printed already): exit 2, with the message and hint kept for the
    JSON object `--json` promises on every exit."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(2)
        self.message, self.hint = message, hint


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="eyas", description="Read, check, convert, run, train and debug EAGLE-3 draft models, offline.",
        epilog="`python -m eyas VERB ...` is the same; `torchrun --nproc_per_node=N -m eyas train ...` "
        "trains with DDP.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB")

    def command(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, epilog=EXAMPLES[name],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=fn)
        return p

    _checkpoint_verbs(command)
    _feature_verbs(command)
    _decoding_verbs(command)
    parser.verbs = dict(sub.choices)
    return parser
