#!/bin/bash
# batch-1 DFlash trees on a GPU: the eager drafter (the code before, ea78d5a's files in .dev/before) against the static
# drafter's captured tree step on one row (this tree), alternating; then a two-turn cell behind 31,500 filler tokens
mkdir -p /tmp/drf; cat /tmp/drfparts/part_aa .dev/d16b/part_ab > /tmp/drf/model.safetensors; cp .dev/d16b/config.json /tmp/drf/
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r $(ls) /tmp/before/; cp -r .dev/before/* /tmp/before/
ls /tmp/before
T="--target /tmp/tgt --drafter /tmp/drf --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --tree-lookup 15 --max-new-tokens 256 --no-pld"
here=$PWD
for rep in 1 2; do
  for code in before after; do
    dir=$here; [ $code = before ] && dir=/tmp/before
    s=$(date +%s.%N); (cd $dir && timeout 200 python -m eval mtbench $T --num-questions 10 --out $OUT/${code}_$rep > $OUT/${code}_$rep.txt 2>&1); e=$(date +%s.%N)
    echo "$code rep $rep: $(python3 -c "print(round($e - $s, 1))") s"; head -14 $OUT/${code}_$rep/summary.md; tail -2 $OUT/${code}_$rep.txt
  done
done
