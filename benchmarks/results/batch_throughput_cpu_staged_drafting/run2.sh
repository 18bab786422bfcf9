#!/usr/bin/env bash
# After run.sh: the per-method profile (benchmarks/profile_cpu_phases.py, 8 conversations, one process) before and after,
# at batch 4 on one thread (a batch-8 worker's share) and batch 1 on two; then all 80 conversations before and after.
set -u
BEFORE=${BEFORE:-/work/wt_before} EXPORT=${EXPORT:-/work/recipe_export} TARGET=${TARGET:-/work/shared/targets/qwen3-27m-sharegpt}
OUT=$(cd "$(dirname "$0")" && pwd) NEW=$(cd "$(dirname "$0")/../../.." && pwd)
P="--target $TARGET --drafter $EXPORT --questions 8"
for side in before after; do
  dir=$([ $side = before ] && echo $BEFORE || echo $NEW)
  (cd $dir && python benchmarks/profile_cpu_phases.py $P --batch-size 4 --threads 1 2>/dev/null > $OUT/profile_${side}_b4t1.txt
   python benchmarks/profile_cpu_phases.py $P --batch-size 1 --threads 2 2>/dev/null > $OUT/profile_${side}_b1t2.txt)
done
A="--target $TARGET --drafter $EXPORT --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter --questions 80"
(cd $BEFORE && python benchmarks/batch_throughput.py $A 2>/dev/null > $OUT/before80.txt)
(cd $NEW && python benchmarks/batch_throughput.py $A 2>/dev/null > $OUT/after80_2.txt)
