#!/bin/bash
# call 3 (fifteenth session): the fourteenth session's drafter (carried in .gl/c5 as its returned pieces) rebuilt on the
# device and decoded on MT-Bench and the held-out prompts: the same 384-node trees again, prompt lookup with 32 drafts,
# and a bigger tree (1,024 nodes, depth 24), each pair side by side; the evaluations back as one archive.
# Waits first (up to WAIT0 s) for the regeneration of call 2 to end, so that it is timed alone.
set -u; T0=$(date +%s); C=$PWD/.gl/c5; W=${SM_DIR:-/tmp/sm}; E=$W/e15; mkdir -p $E
while ! grep -q "all done" $W/times.txt 2>/dev/null && [ $(( $(date +%s) - T0 )) -lt ${WAIT0:-300} ]; do sleep 5; done
echo "waited $(( $(date +%s) - T0 )) s for the regeneration"; cat $W/times.txt 2>/dev/null
cd ${REPO:-/tmp/repo_snapshot}; export PYTHONUNBUFFERED=1 PYTHONPATH=${SITE:-/tmp/site} SWA_DRAFTERS_CACHE=${CACHE:-/tmp/swacache}
python3 benchmarks/device_recipes/smollm2_eagle3_two_layers/rebuild_drafter.py $C $E/d14 --target builtin:smollm2-135m-instruct || exit 1
stamp() { echo "$(date +%H:%M:%S) $(( $(date +%s) - T0 )) $*" | tee -a $E/times.txt; }
evaluate() {  # evaluate NAME FLAGS...: MT-Bench and the held-out prompts side by side (pipeline.sh's)
  local name=$1; shift
  for set in mtbench prompts; do
    local extra=""; [ $set = prompts ] && extra="--prompts /tmp/pf/sharegpt_heldout_prompts.jsonl"
    ( python3 -m eval $set $extra --target builtin:smollm2-135m-instruct --max-new-tokens 256 --batch-size 16 --no-baseline \
        "$@" ${EVAL_EXTRA:-} --out $E/eval_${set}_$name > $E/eval_${set}_$name.log 2>&1
      stamp "eval $set ($name) rc=$?" ) &
  done
}
evaluate eagle3_k16n384d16 --drafter $E/d14 --tree-topk 16 --tree-tokens 384 --draft-steps 16
evaluate pld32 --drafter pld --draft-steps 32
wait
[ -z "${SKIP_BIG:-}" ] && { evaluate eagle3_k16n1024d24 --drafter $E/d14 --tree-topk 16 --tree-tokens 1024 --draft-steps 24; wait; }
for f in $E/eval_*.log; do echo "== $f"; grep -A4 "^| turns" "$f" | head -5; grep "vLLM" "$f"; tail -1 "$f"; done
cd $E && tar czf ${OUT:-/tmp}/evals15.tgz times.txt eval_*/ eval_*.log
