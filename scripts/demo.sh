#!/usr/bin/env bash
# The main job on the embedded default (SmolLM2-135M-Instruct) with the draft eyas ships for it
# (every verb below reads that draft when none is named): inspect it, measure it standalone on a
# handful of MT-bench questions (tau and per-depth acceptance), then a short benchmark against
# Hugging Face greedy and prompt lookup (the speedup), then one answer the way `eyas generate` decodes
# by default. No flag picks anything: the dtype and the chain/tree shape are the ones measured fastest
# on this machine (measured once, the first time, said on stderr; the draft is off where nothing beat
# the target alone).
set -euo pipefail
cd "$(dirname "$0")/.."
EYAS=.venv/bin/eyas
$EYAS inspect
$EYAS eval --prompts mtbench --limit 5 --max-new-tokens 128
$EYAS bench --prompts mtbench --limit 3 --max-new-tokens 96
$EYAS generate --prompt "Explain speculative decoding in two sentences." --max-new-tokens 64
