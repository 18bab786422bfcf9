#!/usr/bin/env bash
# SmolLM2 DFlash, the dflash_swa_small recipe as the trees section's drafter (10,000 records, 3,000 steps), with blocks
# whose first 1..3 slots are revealed half the time (drafter.reveal_prob=0.5, reveal_max=3).
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo
R=/tmp/res7; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
stamp "train start"
python3 -m train experiment=dflash_swa_small logger=none target.path=builtin:smollm2-135m-instruct \
  data.path=/tmp/pf/sharegpt_prompts.jsonl trainer.progress=false data.max_records=10000 trainer.max_steps=3000 \
  trainer.time_limit_minutes=25 trainer.checkpoint_every=500 trainer.eval_every=100000 trainer.loop_eval_prompts=0 \
  drafter.reveal_prob=0.5 drafter.reveal_max=3 output_dir=$R/run > $R/train.log 2>&1
stamp "train done rc=$?"
touch $R/TRAINED
