#!/bin/bash
cat /tmp/drfparts/part_* .dev/d/part_ad > /tmp/drf/model.safetensors 2>/dev/null; cp .dev/d/config.json /tmp/drf/
ls -la /tmp/drf /tmp/tgt | head -20
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site
E="python -m eval mtbench --target /tmp/tgt --drafter /tmp/drf --prefill-tokens 31500 --max-new-tokens 256 --batch-size 16 --no-pld --no-baseline"
timeout 150 $E --num-questions 2 --out $OUT/warm > $OUT/warm.txt 2>&1; tail -3 $OUT/warm.txt
for run in whole reuse whole2 reuse2; do
  flag=""; case $run in whole*) flag="--no-prefix-reuse";; esac
  s=$(date +%s.%N); timeout 95 $E --num-questions 32 --out $OUT/$run $flag > $OUT/$run.txt 2>&1; e=$(date +%s.%N)
  echo "$run: $(python3 -c "print(round($e - $s, 1))") s"; sed -n 5p $OUT/$run/summary.md
done
