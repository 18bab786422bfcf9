#!/bin/bash
# call 3: wait for training (finish at the last checkpoint if the time limit stopped it), then the 384-node trees
set -u; T0=$(date +%s); export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache; W=/tmp/sm
cd /tmp/repo_snapshot
while [ ! -f $W/train.rc ] && [ $(( $(date +%s) - T0 )) -lt ${WAIT:-300} ]; do sleep 5; done
cat $W/times.txt; grep -E "drafter:|step [0-9]+:|done|stopping|Error" $W/train.log | tail -8
cp $W/train.log $W/times.txt $W/run/metrics.jsonl $W/regen_sha.txt $W/tree.txt $OUT/ 2>/dev/null
if [ ! -f $W/run/export/config.json ]; then
  step=$(ls -d $W/run/checkpoints/step_* 2>/dev/null | sed 's/.*step_0*//' | sort -n | tail -1)
  echo "no export; finishing at step ${step:-none}"; pkill -f "python3 -m train" ; sleep 3
  [ -n "$step" ] && timeout 150 python3 -m train \
    experiment=eagle3_swa_small logger=none target.path=builtin:smollm2-135m-instruct data.path=/tmp/pf/regen.jsonl \
    data.regenerate.enabled=false data.max_records=null drafter.draft_vocab_size=16384 data.pack_documents=true data.pack_length=2048 \
    trainer.attention_backend=flex trainer.max_steps=$step trainer.checkpoint_every=250 trainer.eval_every=100000 \
    trainer.loop_eval_prompts=0 trainer.progress=false output_dir=$W/run >> $W/train.log 2>&1
fi
for shape in "16 384 16" "10 128 12 12"; do
 read -r k n d l <<< "$shape"; name=k${k}n${n}d${d}${l:+l$l}
 for set in mtbench prompts; do
  extra=""; [ $set = prompts ] && extra="--prompts /tmp/pf/sharegpt_heldout_prompts.jsonl"
  left=$(( 585 - ($(date +%s) - T0) )); [ $left -lt 100 ] && break 2
  timeout $left python3 -m eval $set $extra --target builtin:smollm2-135m-instruct --drafter $W/run --max-new-tokens 256 --batch-size 16 \
    --no-baseline --tree-topk $k --tree-tokens $n --draft-steps $d ${l:+--tree-lookup $l} --out $W/eval_${set}_$name > $W/eval_${set}_$name.log 2>&1
  echo "$set $name rc=$? $(( $(date +%s) - T0 ))s"; grep -A3 "^| turns" $W/eval_${set}_$name.log | head -4
 done
done
cd $W && tar czf $OUT/evals.tgz eval_* 2>/dev/null; ls $OUT
