"""Real serving engines: vLLM runs eyas drafts on CPU, and eyas holds what it does against the contract.

- `launch`: where the engines are installed (`bash scripts/install-engines.sh`), and `run_vllm`,
  which runs `vllm_worker.py` in the engine's own venv and process group.
- `vllm_worker`: the script the engine's python runs (vllm, torch, safetensors only): one `vllm.LLM`
  per draft, greedy or sampled; its counters (per request too), wiring, drafts and what it fed the draft.
- `predict`: eyas's acceptance on the engine's own token sequences, in the engine's definition; when
  sampling, its expectation on the engine's own draft steps and the tokens' fit to the target.
- `compare`: served against predicted (a test per position, and the paired difference per prompt),
  the sampled tokens against the target's distribution, and the engine's wiring against the contract
  (its model objects, and the dump matched against eyas's capture).
- `serve_check`: `eyas serve-check` (`serve_check`) and its text (`format_serve_check`).
- `llamacpp`: running llama.cpp's converter on a draft (its consumer view is eyas.check.llamacpp).
"""

from eyas.engines.launch import INSTALL_COMMAND, engine_python, engines_dir, llamacpp_dir, run_vllm
from eyas.engines.serve_check import DEFAULT_LIMIT, format_serve_check, serve_check, serve_check_many

__all__ = [
    "DEFAULT_LIMIT",
    "INSTALL_COMMAND",
    "engine_python",
    "engines_dir",
    "format_serve_check",
    "llamacpp_dir",
    "run_vllm",
    "serve_check",
    "serve_check_many",
]
