#!/usr/bin/env bash
# On the device machine: join the wheel pieces `recipes/gpu-stage.sh` packed (carried over several
# calls into $STAGE/part-*) and install them into SITE, for PYTHONPATH=$SITE:src. INSTALL=0 only joins
# them (into $SITE/wheels).
#
#   bash recipes/gpu-unstage.sh && export PYTHONPATH=/tmp/site:src PYTHON=python3
set -euo pipefail
STAGE=${STAGE:-runs/stage}
SITE=${SITE:-/tmp/site}
INSTALL=${INSTALL:-1}
mkdir -p "$SITE/wheels"
for wheel in $(ls "$STAGE"/part-*/*.whl.[0-9][0-9]-of-[0-9][0-9] | sed 's|.*/||; s|\.[0-9-]*of-[0-9]*$||' | sort -u); do
  pieces=$(ls "$STAGE"/part-*/"$wheel".[0-9][0-9]-of-[0-9][0-9] | awk -F. '{print $NF " " $0}' | sort | cut -d' ' -f2-)
  have=$(echo "$pieces" | wc -l) want=$(( 10#${pieces##*-of-} ))
  if (( have != want )); then
    echo "error: $wheel has $have of its $want pieces; hint: carry every $STAGE/part-K first" >&2
    exit 2
  fi
  cat $pieces > "$SITE/wheels/$wheel"
done
[ "$INSTALL" = 0 ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$SITE"/wheels/*.whl
echo "wheels in $SITE/wheels$([ "$INSTALL" = 0 ] || echo ", installed in $SITE")" >&2
