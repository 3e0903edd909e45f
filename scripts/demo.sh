#!/usr/bin/env bash
# The main job on the embedded default: build a draft for SmolLM2-135M-Instruct and inspect it.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/eyas init out/smollm2-draft --force
.venv/bin/eyas inspect out/smollm2-draft
