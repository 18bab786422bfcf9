#!/bin/bash
# batch-1 DFlash trees on a GPU through the batched runner on one row (this tree): the 10-question cell in bf16 (prompt
# lookup beside), in fp32 (the lossless check), then two-turn conversations behind 31,500 filler tokens
mkdir -p /tmp/drf; cat /tmp/drfparts/part_aa .dev/d16b/part_ab > /tmp/drf/model.safetensors; cp .dev/d16b/config.json /tmp/drf/
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site
T="--target /tmp/tgt --drafter /tmp/drf --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --tree-lookup 15 --max-new-tokens 256"
run() {  # name timeout args...
  name=$1; lim=$2; shift 2
  s=$(date +%s.%N); timeout $lim python -m eval mtbench $T "$@" --out $OUT/$name > $OUT/$name.txt 2>&1; rc=$?; e=$(date +%s.%N)
  echo "== $name rc=$rc: $(python3 -c "print(round($e - $s, 1))") s"; head -16 $OUT/$name/summary.md 2>/dev/null || tail -3 $OUT/$name.txt
}
run bf16_10q 170 --num-questions 10
run bf16_10q_again 120 --num-questions 10 --no-pld --no-baseline
run fp32_10q 170 --num-questions 10 --dtype float32 --no-pld
run bf16_31500 150 --num-questions 4 --prefill-tokens 31500
