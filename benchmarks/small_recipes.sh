#!/usr/bin/env bash
# Issue 25's on-policy recipes end to end on one GPU: experiment=dflash_swa_small and eagle3_swa_small
# (regeneration through our batched loop, then training), each export through `python -m eval` on MT-Bench
# (DFlash: 80 questions x 2 turns at batch 16; EAGLE-3, which decodes at batch 1: 40; 256 new tokens, prompt lookup
# and the target alone in the same run) and on held-out ShareGPT prompts. (No long-prefill window sweep yet.)
#
#   bash benchmarks/small_recipes.sh TARGET PROMPTS HELDOUT OUT [dflash] [eagle3] -- [extra overrides...]
#     PROMPTS: ShareGPT JSON/JSONL (its user turns are what the target answers); HELDOUT: eval prompts JSONL
set -uo pipefail
target=$1 data=$2 heldout=$3 out=$4
shift 4
kinds=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do kinds+=("$1"); shift; done
[ $# -gt 0 ] && shift
mkdir -p "$out"
for kind in "${kinds[@]}"; do
  run="$out/run_$kind"
  start=$(date +%s)
  python -m train experiment=${kind}_swa_small logger=none target.path="$target" data.path="$data" trainer.progress=false \
    output_dir="$run" "$@" 2>&1 | grep --line-buffered -v "it/s\]" > "$out/train_$kind.log"
  echo "$kind: train (with regeneration) $(( $(date +%s) - start )) s" | tee -a "$out/times.txt"
  start=$(date +%s)
  bs=16; nq=80; [ "$kind" = eagle3 ] && bs=1 && nq=40   # EAGLE-3 decodes at batch 1 (infer/batch.py)
  python -m eval mtbench --target "$target" --drafter "$run" --max-new-tokens 256 --batch-size $bs --num-questions $nq --device cuda \
    --out "$out/mtbench_$kind" 2>&1 | grep --line-buffered -v "it/s\]" | tail -25 > "$out/mtbench_$kind.log"
  python -m eval prompts --prompts "$heldout" --target "$target" --drafter "$run" --max-new-tokens 256 --batch-size $bs \
    --device cuda --no-baseline --out "$out/heldout_$kind" 2>&1 | grep --line-buffered -v "it/s\]" | tail -25 > "$out/heldout_$kind.log"
  echo "$kind: eval $(( $(date +%s) - start )) s" | tee -a "$out/times.txt"
done
