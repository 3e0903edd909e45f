"""Run vLLM on a JSON job and write what it did as JSON: run as a FILE by the engine venv's python.

    <engine python> vllm_worker.py JOB.json RESULT.json

Standard library, vllm, torch and safetensors only: eyas is not importable in the engine's venv, and
eyas never imports vllm (`eyas.engines.vllm` starts this script in its own process group).

The job: {"target": DIR, "prompts": [[token ids], ...], "max_new_tokens": N, "max_model_len": N (absent: the model's),
"warmup": bool, "temperature": T (0: greedy, the default), "runs": [{"name": str, "speculative_config": {...} |
null, "dump": PATH | null}, ...]}. Each run builds ONE `vllm.LLM` (fp32, eager, batch 1, stats on; at T > 0
request i samples with seed i, no top-p or top-k), generates every prompt one request
at a time, and is deleted before the next run, so several drafts share one engine start-up of the
interpreter. Per run the result holds: `loaded` and the engine's `error` text; `outputs` (token ids);
the spec-decode counters (`vllm:spec_decode_*`, summed over the run, and `per_request`: each
request's own, read before and after it); the engine's own log lines that
name its wiring; `wiring`, read from the live model objects (the layers the target captures, the
draft's norm flags, its vocab map, whether its embeddings are the target's); `drafts`, each draft
the proposer made (its chain start and tokens); and, with `dump`, what the draft was fed for the
first prompt, written in eyas's dump format (docs/engine-dumps.md).

The engine core runs IN this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`; by default vLLM spawns it,
which is why the script keeps its `__main__` guard), so that the hooks below reach the live model.
Intel OpenMP should be in LD_PRELOAD (`eyas.engines.launch` puts the venv's libiomp5 there).

Hooks (read from vLLM 0.32's `v1/spec_decode/llm_base_proposer.py` and `llama_eagle3.py`): the
proposer's `propose` gets the target's tokens, positions and concatenated aux states of one step
plus the index of the last valid row (`token_indices_to_sample`; rows after it are rejected drafts),
calls the draft's `combine_hidden_states` on the states (before `fc`: what a dump holds) and then the
draft's forward with the ids shifted one left (row i carries x_{i+1}) at the target's positions.
The dump is built from what the draft itself received: features[p] = the state at draft position p,
input_ids[p+1] = the token the draft read there.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback

ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process, so the hooks reach it
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # `auto` reserves a core for the engine
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# Engine log lines that say how it wired the draft (kept verbatim in the result).
WIRING_LOG = ("auxiliary layers", "embed_tokens", "embedding weights", "lm_head weights", "resolved architecture",
              "draft_id_to_target_id")


class OutputTap:
    """The engine's stdout and stderr, captured at the file-descriptor level for the duration of a run.

    vLLM reconfigures its loggers while an engine starts, so a logging handler misses the lines that
    matter (they are logged during start-up); the descriptors catch every line, C++ warnings included.
    The text is echoed to the real stderr afterwards, so a person watching still sees it.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> "OutputTap":
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = [os.dup(1), os.dup(2)]
        self._file = open(self.path, "w")
        os.dup2(self._file.fileno(), 1)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._file.close()
        with open(self.path, errors="replace") as f:
            self.lines = f.read().splitlines()
        sys.stderr.write("\n".join(self.lines[-200:]) + "\n")


def counters(llm) -> dict:
    """The spec-decode counters (cumulative since the engine started)."""
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:spec_decode_")
        if name == "num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = [int(v) for v in m.values]
        elif name in out:
            out[name] = int(m.value)
    return out


def minus(a: dict, b: dict) -> dict:
    """Counters of one request: after minus before."""
    per = [x - (b["accepted_per_pos"][i] if i < len(b["accepted_per_pos"]) else 0)
           for i, x in enumerate(a["accepted_per_pos"])]
    keys = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    return {k: a[k] - b[k] for k in keys} | {"accepted_per_pos": per}


def model_runner(llm):
    """The in-process engine's model runner (V1 engine core, uniprocess executor)."""
    core = llm.llm_engine.engine_core.engine_core
    return core.model_executor.driver_worker.worker.model_runner


class Recorder:
    """Wraps the proposer and its draft model to record what each draft step received and proposed."""

    def __init__(self, runner) -> None:
        self.drafter = getattr(runner, "drafter", None)
        self.request = -1
        self.keep_states_for = 0  # the request whose inputs are kept for the dump
        self.drafts: list[list] = []  # [request, chain start, [tokens]]
        self.rows: dict[int, tuple] = {}  # draft position -> (token read there, state before fc)
        self._valid: int | None = None
        self._states = None
        model = getattr(self.drafter, "model", None)
        if model is None or not hasattr(model, "combine_hidden_states"):
            return  # n-gram, or no speculation: nothing to hook
        propose, combine, forward = self.drafter.propose, model.combine_hidden_states, model.forward

        def on_propose(*args, **kw):
            t = kw.get("token_indices_to_sample")
            n = kw["target_token_ids"].shape[0]
            self._valid = n if t is None else int(t[0]) + 1  # batch of one request
            out = propose(*args, **kw)
            start = int(kw["target_positions"][self._valid - 1])
            self.drafts.append([self.request, start, [int(x) for x in out[0].tolist()]])
            self._valid = None
            return out

        def on_combine(hidden_states):
            if self._valid is not None and self.request == self.keep_states_for:
                self._states = hidden_states[: self._valid].detach().float().cpu().clone()
            return combine(hidden_states)

        def on_forward(input_ids, positions, hidden_states, *args, **kw):
            if self._states is not None:
                n = self._states.shape[0]
                for tok, pos, state in zip(input_ids[:n].tolist(), positions[:n].tolist(), self._states):
                    self.rows[int(pos)] = (int(tok), state)
                self._states = None
            return forward(input_ids, positions, hidden_states, *args, **kw)

        self.drafter.propose, model.combine_hidden_states, model.forward = on_propose, on_combine, on_forward

    def dump(self, first_token: int, path: str) -> int:
        """Write the kept request's draft inputs as an eyas dump; returns its positions (0: nothing)."""
        import torch
        from safetensors.torch import save_file

        ids, feats, p = [first_token], [], 0
        while p in self.rows:  # positions 0..P contiguous; the draft read x_{p+1} at position p
            tok, state = self.rows[p]
            feats.append(state)
            ids.append(tok)
            p += 1
        if p < 4:
            return 0
        # the last token read has no state of its own yet (its target pass had not run)
        save_file({"input_ids": torch.tensor(ids[:p], dtype=torch.long), "features": torch.stack(feats).contiguous()},
                  path)
        return p


def wiring(runner, llm) -> dict:
    """What the live engine objects say about the draft's wiring (None where there is no draft)."""
    out: dict = {}
    target = runner.get_model()
    decoder = getattr(target, "model", target)
    layers = getattr(decoder, "aux_hidden_state_layers", None)
    out["aux_layers"] = None if layers is None else [int(x) for x in layers]
    drafter = getattr(runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None or not hasattr(model, "combine_hidden_states"):
        return out
    inner = model.model
    layer0 = inner.layers[0]
    residual = getattr(getattr(layer0, "_residual_norm", None), "__name__", "")
    d2t = getattr(model, "draft_id_to_target_id", None)
    cfg = model.config
    ec = getattr(cfg, "eagle_config", None) or {}
    t_embed = getattr(getattr(target, "model", None), "embed_tokens", None)
    out.update({
        "draft_class": type(model).__name__,
        "method": llm.llm_engine.vllm_config.speculative_config.method,
        "norm_before_residual": residual == "_norm_before_residual",
        "norm_before_fc": bool(getattr(inner, "norm_before_fc", False)),
        "fc_norm": getattr(inner, "fc_norm", None) is not None,
        "norm_output": bool(getattr(inner, "norm_output", False)),
        "use_aux_hidden_state": bool(getattr(inner, "use_aux_hidden_state", True)),
        "num_aux_hidden_states": getattr(inner, "num_aux_hidden_states", None),
        "fc_input_size": getattr(inner, "fc_input_size", None),
        "draft_vocab_size": int(cfg.draft_vocab_size) if getattr(cfg, "draft_vocab_size", None) else None,
        "d2t": None if d2t is None else [int(x) for x in d2t.detach().cpu().tolist()],
        "has_own_embed_tokens": bool(getattr(model, "has_own_embed_tokens", False)),
        "embeddings_shared": t_embed is not None and inner.embed_tokens.weight is t_embed.weight,
        "config_ids": getattr(cfg, "eagle_aux_hidden_state_layer_ids", None),
        "config_nested_ids": ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None,
    })
    out["fc_in_features"] = getattr(getattr(inner, "fc", None), "input_size", None)
    return out


def serve(job: dict, run: dict) -> dict:
    """One run: build the engine, generate every prompt, read counters, wiring and draft inputs."""
    from vllm import LLM, SamplingParams

    res: dict = {"name": run["name"], "loaded": False, "error": None}
    t0 = time.perf_counter()
    try:
        llm = LLM(model=job["target"], speculative_config=run.get("speculative_config"), dtype="float32",
                  enforce_eager=True, max_model_len=job.get("max_model_len"), max_num_seqs=1,
                  disable_log_stats=False, seed=0)
    except Exception as e:  # the engine's own refusal is the answer
        res["error"] = f"{type(e).__name__}: {e}"
        return res
    res["loaded"], res["seconds_load"] = True, round(time.perf_counter() - t0, 1)
    try:
        runner = model_runner(llm)
        rec = Recorder(runner)
        temperature = job.get("temperature", 0.0)
        if job.get("warmup") and job["prompts"]:  # untimed and uncounted: first-call costs stay out of timings
            llm.generate([{"prompt_token_ids": job["prompts"][0]}], SamplingParams(temperature=0.0, max_tokens=8,
                                                                                   detokenize=False), use_tqdm=False)
        before = last = counters(llm)
        res["outputs"], res["per_request"] = [], []
        t1 = time.perf_counter()
        for i, ids in enumerate(job["prompts"]):
            rec.request = i
            params = SamplingParams(temperature=temperature, max_tokens=job["max_new_tokens"], detokenize=False,
                                    seed=i if temperature > 0 else None)  # request i samples the same on every run
            out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
            res["outputs"].append(list(out.outputs[0].token_ids))
            now = counters(llm)  # one read per request: its end is the next one's start
            res["per_request"].append(minus(now, last))
            last = now
        res["seconds_generate"] = round(time.perf_counter() - t1, 2)
        res["counters"] = minus(last, before)
        res["drafts"] = rec.drafts
        res["wiring"] = wiring(runner, llm)
        if run.get("dump") and job["prompts"]:
            res["dump_positions"] = rec.dump(job["prompts"][0][0], run["dump"])
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
    finally:
        del llm
        gc.collect()
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()  # the next run builds its own engine in this process
    return res


def main(job_path: str, result_path: str) -> None:
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    with open(job_path) as f:
        job = json.load(f)
    t0 = time.perf_counter()
    result: dict = {"engine": "vllm", "version": None, "runs": []}
    try:
        import vllm

        result["version"] = vllm.__version__
    except Exception as e:
        result["error"] = f"import vllm failed: {type(e).__name__}: {e}"
    for i, run in enumerate(job["runs"] if result["version"] else []):
        with OutputTap(f"{result_path}.{i}.log") as tap:
            res = serve(job, run)
        wired = [ln for ln in tap.lines if any(w in ln.lower() for w in WIRING_LOG)]
        res["log"] = wired if res["loaded"] else tap.lines[-60:]  # a refusal: the engine's last words
        result["runs"].append(res)
        write(result_path, result)  # partial results survive a later crash or timeout
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write(result_path, result)


def write(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: vllm_worker.py JOB.json RESULT.json")
    main(sys.argv[1], sys.argv[2])
