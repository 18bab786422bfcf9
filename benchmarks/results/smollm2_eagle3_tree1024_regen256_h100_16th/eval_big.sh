#!/bin/bash
# sixteenth session: the one-lease pipeline stopped (its regeneration took 17.5 min, leaving 300 steps); the fourteenth
# session's drafter decoded with the 1,024-node depth-24 tree beside prompt lookup with 32 drafts, all four side by side
set -u; T0=$(date +%s); C=$PWD/.gl/c5; W=/tmp/sm; E=$W/e16; mkdir -p $E
pkill -f pipeline.sh; pkill -f "python3 -m train"; pkill -f "python3 -m eval"; sleep 3; cat $W/times.txt
cd /tmp/repo_snapshot; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache
python3 benchmarks/device_recipes/smollm2_eagle3_two_layers/rebuild_drafter.py $C $E/d14 --target builtin:smollm2-135m-instruct || exit 1
stamp() { echo "$(date +%H:%M:%S) $(( $(date +%s) - T0 )) $*" | tee -a $E/times.txt; }
evaluate() {
  local name=$1; shift
  for set in mtbench prompts; do
    local extra=""; [ $set = prompts ] && extra="--prompts /tmp/pf/sharegpt_heldout_prompts.jsonl"
    ( python3 -m eval $set $extra --target builtin:smollm2-135m-instruct --max-new-tokens 256 --batch-size 16 --no-baseline \
        "$@" --out $E/eval_${set}_$name > $E/eval_${set}_$name.log 2>&1
      stamp "eval $set ($name) rc=$?" ) &
  done
}
evaluate eagle3_k16n1024d24 --drafter $E/d14 --tree-topk 16 --tree-tokens 1024 --draft-steps 24
evaluate pld32 --drafter pld --draft-steps 32
( while sleep 20; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> $E/gpu.log; done ) &
S=$!
while [ $(jobs -r | wc -l) -gt 1 ] && [ $(( $(date +%s) - T0 )) -lt ${LIMIT:-420} ]; do sleep 5; done
kill $S
for f in $E/eval_*.log; do echo "== $f"; grep -A4 "^| turns" "$f" | head -5; grep "vLLM" "$f"; tail -1 "$f"; done
cd $E && tar czf $OUT/evals16.tgz times.txt gpu.log eval_*/ eval_*.log; cp $W/times.txt $OUT/pipeline_times.txt; tar czf $OUT/logs16.tgz -C $W times.txt regen.log probe.log train.log pipeline.out gpu_util.log 2>/dev/null; ls $OUT
