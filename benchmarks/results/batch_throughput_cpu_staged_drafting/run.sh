#!/usr/bin/env bash
# Staged drafting (3e89dc5) against the code before it (7bbace3, a worktree at BEFORE), alternately, 16 MT-Bench
# conversations, batch 1 (two threads) and batch 8 (eval's two one-thread workers), the recipe's DFlash drafter
# (EXPORT: results/issue24_recipe_drafter_h100's), then all 80 conversations with the new code. 2-core AVX2 EPYC, nothing else running.
set -u
BEFORE=${BEFORE:-/work/wt_before} EXPORT=${EXPORT:-/work/recipe_export} TARGET=${TARGET:-/work/shared/targets/qwen3-27m-sharegpt}
OUT=$(cd "$(dirname "$0")" && pwd) NEW=$(cd "$(dirname "$0")/../../.." && pwd)
A="--target $TARGET --drafter $EXPORT --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter"
for i in 1 2; do
  (cd $BEFORE && python benchmarks/batch_throughput.py $A --questions 16 2>/dev/null > $OUT/before16_$i.txt)
  (cd $NEW && python benchmarks/batch_throughput.py $A --questions 16 2>/dev/null > $OUT/after16_$i.txt)
done
(cd $NEW && python benchmarks/batch_throughput.py $A --questions 80 2>/dev/null > $OUT/after80.txt)
