#!/usr/bin/env bash
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
R=/tmp/res9; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
T=builtin:smollm2-135m-instruct; H=/tmp/hp/sharegpt_heldout_prompts.jsonl; D=/tmp/dr
stamp "convert"
python3 -m infer --target $T --drafter pld --prompt hi --max-new-tokens 4 > $R/warm.log 2>&1
stamp "evals start"
E="--target $T --drafter $D --max-new-tokens 256 --batch-size 16 --no-baseline --no-pld"
(timeout 290 python3 -m eval mtbench $E --tree-topk 16 --tree-tokens 384 --tree-redraft 2 --out $R/mtbench_r2 > $R/mtbench_t16_384_r2.log 2>&1; stamp "mtbench 384 r2 rc=$?") &
(timeout 290 python3 -m eval mtbench $E --tree-topk 16 --tree-tokens 384 --tree-redraft 3 --out $R/mtbench_r3 > $R/mtbench_t16_384_r3.log 2>&1; stamp "mtbench 384 r3 rc=$?") &
(timeout 290 python3 -m eval mtbench $E --tree-topk 24 --tree-tokens 768 --tree-redraft 3 --out $R/mtbench_768r3 > $R/mtbench_t24_768_r3.log 2>&1; stamp "mtbench 768 r3 rc=$?") &
(timeout 290 python3 -m eval prompts --prompts $H $E --tree-topk 24 --tree-tokens 768 --tree-redraft 2 --out $R/heldout_768r2 > $R/heldout_t24_768_r2.log 2>&1; stamp "heldout 768 r2 rc=$?") &
wait
stamp done
