#!/usr/bin/env bash
# The GPU recipe (recipes/smollm2-135m-instruct-gpu.sh) with every usable ShareGPT first turn
# (deduplicated against the evaluation sets) answered twice: greedily and sampled at temperature 0.8.
# The two captures train as one data set (`eyas train --data A,B`), so the draft sees the target's
# argmax path and the paths sampled serving takes. Everything else, resuming across calls included,
# is the GPU recipe's; any of its variables may still be set (PROMPTS, TEMPERATURES, LIMIT, ...).
#
#   bash recipes/smollm2-135m-instruct-gpu-sampled.sh DRAFT_FOLDER
set -euo pipefail
export PROMPTS=${PROMPTS:-sharegpt-clean} TEMPERATURES=${TEMPERATURES:-0,0.8} RUN=${RUN:-runs/smollm2-gpu-sampled}
exec bash "$(dirname "$0")/smollm2-135m-instruct-gpu.sh" "$@"
