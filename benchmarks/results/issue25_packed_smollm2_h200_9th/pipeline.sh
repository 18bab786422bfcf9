#!/bin/bash
# on the device, in its own process session: regenerate 15,000 ShareGPT conversations with SmolLM2 and train EAGLE-3 on
# best-fit packed documents (one process, cold compile, trainer.compile_cache written after step 1); then the 384-node
# trees on MT-Bench and the held-out prompts (two processes side by side) and the compile-cache check (a fresh Inductor
# and Triton cache, the saved file loaded, 10 steps) beside them
set -u
W=/tmp/sm; cd /tmp/repo_snapshot
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache
stamp() { echo "$(date +%H:%M:%S) $*" >> $W/times.txt; }
C="experiment=eagle3_swa_small logger=none target.path=builtin:smollm2-135m-instruct data.path=/tmp/pf/sharegpt_prompts.jsonl
   data.max_records=15000 drafter.draft_vocab_size=16384 data.pack_documents=true data.pack_length=2048
   trainer.attention_backend=flex trainer.eval_every=100000 trainer.loop_eval_prompts=0 trainer.progress=false"
stamp "train start (steps $STEPS)"
python3 -m train $C trainer.max_steps=$STEPS trainer.checkpoint_every=250 trainer.compile_cache=$W/cc.bin output_dir=$W/run > $W/train.log 2>&1
stamp "train end rc=$?"
ls -la $W/cc.bin >> $W/times.txt 2>&1
for set in mtbench prompts; do
  extra=""; [ $set = prompts ] && extra="--prompts /tmp/pf/sharegpt_heldout_prompts.jsonl"
  ( python3 -m eval $set $extra --target builtin:smollm2-135m-instruct --drafter $W/run --max-new-tokens 256 --batch-size 16 --no-baseline \
      --tree-topk 16 --tree-tokens 384 --draft-steps 16 --out $W/eval_${set}_k16n384d16 > $W/eval_${set}_k16n384d16.log 2>&1
    stamp "eval $set rc=$?" ) &
done
( mkdir -p /tmp/inductor_fresh /tmp/triton_fresh; stamp "cc check start"
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_fresh TRITON_CACHE_DIR=/tmp/triton_fresh python3 -m train $C trainer.max_steps=10 \
    trainer.checkpoint_every=250 trainer.compile_cache=$W/cc.bin output_dir=$W/run_cc > $W/cc_check.log 2>&1
  stamp "cc check end rc=$?" ) &
wait
stamp "all done"
