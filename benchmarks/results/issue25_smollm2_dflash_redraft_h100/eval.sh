#!/usr/bin/env bash
# SmolLM2 DFlash trees with re-drafted depths: the reveal-trained drafter (/tmp/res7/run/export) and the plain one (/tmp/exp16),
# MT-Bench and the held-out prompts, batch 16, 256 new tokens, all evaluations at once (tokens/s are not speed figures).
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo
R=/tmp/res8; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
T=builtin:smollm2-135m-instruct; H=/tmp/pf/sharegpt_heldout_prompts.jsonl
stamp "convert"
python3 -m infer --target $T --drafter pld --prompt hi --max-new-tokens 4 > $R/warm.log 2>&1
stamp "evals start"
ev() {
  local name=$1 D=$2; shift 2
  (python3 -m eval mtbench --target $T --drafter $D --max-new-tokens 256 --batch-size 16 --no-baseline "$@" --out $R/mtbench_$name > $R/mtbench_$name.log 2>&1; stamp "$name mtbench rc=$?") &
  (python3 -m eval prompts --target $T --prompts $H --drafter $D --max-new-tokens 256 --batch-size 16 --no-baseline "$@" --out $R/heldout_$name > $R/heldout_$name.log 2>&1; stamp "$name heldout rc=$?") &
  wait
}
ev new_chain /tmp/res7/run/export &
ev new_t16_384 /tmp/res7/run/export --tree-topk 16 --tree-tokens 384 --no-pld &
ev new_t16_384_r1 /tmp/res7/run/export --tree-topk 16 --tree-tokens 384 --tree-redraft 1 --no-pld &
ev new_t16_384_r2 /tmp/res7/run/export --tree-topk 16 --tree-tokens 384 --tree-redraft 2 --no-pld &
ev new_t16_384_r3 /tmp/res7/run/export --tree-topk 16 --tree-tokens 384 --tree-redraft 3 --no-pld &
ev old_t16_384_r1 /tmp/exp16 --tree-topk 16 --tree-tokens 384 --tree-redraft 1 --no-pld &
ev old_t16_384_r2 /tmp/exp16 --tree-topk 16 --tree-tokens 384 --tree-redraft 2 --no-pld &
ev new_t24_768_r2 /tmp/res7/run/export --tree-topk 24 --tree-tokens 768 --tree-redraft 2 --no-pld &
wait
stamp "evals done"


python3 -m pytest -q -o addopts="" tests/test_dflash_trees.py tests/test_static_drafters.py -k cuda > $R/gpu_tests.txt 2>&1; stamp "gpu tests rc=$?"

touch $R/DONE
