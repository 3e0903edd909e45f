#!/usr/bin/env bash
# Continue training the shipped draft on new captures: a warm start (`eyas train --init`) that keeps its
# weights and vocab map, with a new optimiser, a lower peak lr and a fresh schedule, so accuracy
# accumulates run after run instead of starting from scratch. The peak lr is the one the main run
# ended at: warm starts at 3e-4 and 1e-3 first LOST held-out tau (benchmarks/README.md, "Comparisons at
# small CPU budgets").
#
#   bash recipes/smollm2-135m-instruct-continue.sh SHARDS [SHARDS ...]
#
# SHARDS are capture folders made with the settings INIT was trained on (the shipped draft: the GPU
# recipe's capture, recipes/smollm2-135m-instruct-gpu.sh; the CPU-trained draft it replaced: the main
# recipe's step 1, as below), on prompts the draft has not seen, e.g. ShareGPT prompts 3072..6143:
#   eyas capture --prompts sharegpt --skip 3072 --limit 3072 --max-new-tokens 256 --max-length 512 \
#     --skip-long --batch-size 16 --dtype bf16 --out shards-e
#
# Long and interruptible: one thread per process and `nice`, so the machine stays usable beside it;
# a checkpoint every SAVE_EVERY steps. Rerun the same command after an interruption (same RUN): it
# resumes from the latest checkpoint. On a fresh machine, copy RUN/train/ and the capture folders
# over (same paths or not: the captures are recognised by their fingerprints) and rerun.
# The result: RUN/train/draft (bf16, no embed_tokens), RUN/train/train_log.jsonl, and RUN/heldout_tau.png
# (this run's held-out curve after the INIT draft's own, when it ships a train_log.jsonl).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash recipes/smollm2-135m-instruct-continue.sh SHARDS [SHARDS ...]" >&2; exit 2; }
PYTHON=${PYTHON:-.venv/bin/python}
RUN=${RUN:-runs/smollm2-continue}
INIT=${INIT:-src/eyas/drafts/smollm2-135m-instruct}  # the draft to continue from
TARGET=${TARGET:-}        # a target model folder (default: the embedded SmolLM2-135M-Instruct)
PROCS=${PROCS:-2}         # DDP processes, one thread each (as the main recipe)
NICE=${NICE:-19}
EPOCHS=${EPOCHS:-3}
LR=${LR:-1e-4}            # where the main recipe's schedule ended (1e-3 decayed to 1e-4); higher lost accuracy
TTT_STEPS=${TTT_STEPS:-5}
BATCH_TOKENS=${BATCH_TOKENS:-1024}
MAX_LEN=${MAX_LEN:-512}
SAVE_EVERY=${SAVE_EVERY:-100}
EVAL_EVERY=${EVAL_EVERY:-300}
EVAL_FRACTION=${EVAL_FRACTION:-0.02}
INIT_CPUS=${INIT_CPUS:-2}  # CPU cores INIT's run used, for a log without device fields (the CPU-trained draft: 2 x 1
# thread); a log that records its device (the shipped draft's: one GPU) needs none and ignores it
export OMP_NUM_THREADS=1
target=()
[ -z "$TARGET" ] || target=(--target "$TARGET")
data=$(IFS=,; echo "$*")
mkdir -p "$RUN"

# A run folder with a checkpoint resumes (the warm start happened in its first run); else warm-start.
if ls "$RUN/train/checkpoints"/step_*.pt > /dev/null 2>&1; then start=(--resume); else start=(--init "$INIT"); fi
if [ "$PROCS" -gt 1 ]; then
  launch=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$PROCS" -m eyas)
else
  launch=("$PYTHON" -m eyas)
fi
nice -n "$NICE" "${launch[@]}" train --data "$data" --out "$RUN/train" "${start[@]}" "${target[@]}" \
  --epochs "$EPOCHS" --ttt-steps "$TTT_STEPS" --lr "$LR" --batch-tokens "$BATCH_TOKENS" --max-len "$MAX_LEN" \
  --export-dtype bf16 --save-every "$SAVE_EVERY" --eval-every "$EVAL_EVERY" --eval-fraction "$EVAL_FRACTION" \
  --no-progress --json > "$RUN/train_summary.json"

# The held-out curve, continuing the INIT draft's when it ships its log (held-out sets differ: each run
# holds out part of its own data). CPU-hours count processes x threads.
logs=("$RUN/train/train_log.jsonl") labels=continued
[ ! -f "$INIT/train_log.jsonl" ] || logs=("$INIT/train_log.jsonl" "${logs[@]}") labels="$(basename "$INIT"),continued"
nice -n "$NICE" "$PYTHON" benchmarks/learning_curve.py "${logs[@]}" --label "$labels" --chain --cpus "$INIT_CPUS" \
  --out "$RUN/heldout_tau.png" > "$RUN/heldout_tau.json"
echo "draft in $RUN/train/draft; measure it: eyas eval $RUN/train/draft --prompts mtbench" >&2
