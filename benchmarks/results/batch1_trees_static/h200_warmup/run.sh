#!/bin/bash
# eval's warm-up on a GPU: the batch-1 DFlash tree cell of gpu_after_cells.sh with the default warm-up, then --no-warmup
mkdir -p /tmp/drf; cat /tmp/drfparts/part_aa .dev/d16b/part_ab > /tmp/drf/model.safetensors; cp .dev/d16b/config.json /tmp/drf/
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site
T="--target /tmp/tgt --drafter /tmp/drf --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --tree-lookup 15 --max-new-tokens 256 --num-questions 10"
for name in warmup no_warmup; do
  flag=""; [ $name = no_warmup ] && flag="--no-warmup"
  s=$(date +%s.%N); timeout 200 python -m eval mtbench $T $flag --out /tmp/o_$name > $OUT/$name.txt 2>&1; rc=$?; e=$(date +%s.%N)
  echo "== $name rc=$rc: $(python3 -c "print(round($e - $s, 1))") s"; cp /tmp/o_$name/summary.md $OUT/${name}_summary.md; cat $OUT/${name}_summary.md
done
