#!/usr/bin/env bash
# Issue 25's 32K goal on the held-out split (the goals' prompts are MT-Bench *and* a held-out split): the ShareGPT
# held-out prompts (benchmarks/sharegpt_prompt_files.py's sharegpt_heldout_prompts.jsonl) that fit behind 31,979 filler
# tokens with 128 new tokens (97 of 100: heldout_fits_32k.jsonl, the rule of eval's check_context_fits), at prefill 0
# and behind 31,979 tokens, windows trained and none, prompt lookup beside:
#  - DFlash: the strict-32K drafter of results/issue25_strict32k_h100 (the pack_fresh_fraction=0.5 run), tree + lookup;
#  - EAGLE-3: eagle3_swa_small retrained as results/issue25_eagle3_strict32k_h100/run.sh (that drafter's weights were
#    not kept), then the same sweep, and MT-Bench's 80 questions again for this drafter.
# Carries: .dev/w + .dev/tgtB; .dev/tgtA + .dev/hp + .dev/hp32; .dev/pf4; .dev/g14 (fresh/export_dflash).
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
if ! command -v python > /dev/null; then
  mkdir -p /tmp/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/bin/python && chmod +x /tmp/bin/python
  export PATH=/tmp/bin:$PATH
fi
cd /tmp/repo
R=/tmp/res24; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
H=/tmp/hp32/heldout_fits_32k.jsonl
SW="--target /tmp/tgt --prompts $H --prefills 0 31979 --max-new-tokens 128 --windows trained none"
stamp start
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
(python3 -m eval sweep $SW --drafter /tmp/g14/fresh/export_dflash --batch-size 8 --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 \
   --tree-lookup 15 --out $R/sweep_dflash_heldout > $R/sweep_dflash_heldout.log 2>&1; stamp "dflash heldout rc=$?") &
KINDS=eagle3 SKIP_EVAL=1 SKIP_SWEEP=1 EVAL_TOKENS=128 \
EAGLE3_ARGS="trainer.max_steps=1000 trainer.time_limit_minutes=9 trainer.checkpoint_every=250 trainer.eval_every=100000 trainer.loop_eval_prompts=0" \
bash benchmarks/small_target_pipeline.sh /tmp/tgt /tmp/pf4/sharegpt_prompts.jsonl /tmp/hp/sharegpt_heldout_prompts.jsonl $R 31979 -- \
  data.max_records=3000
python3 -m eval sweep $SW --drafter $R/run_eagle3 --batch-size 16 --out $R/sweep_eagle3_heldout > $R/sweep_eagle3_heldout.log 2>&1; stamp "eagle3 heldout rc=$?"
wait
python3 benchmarks/sweep_kept_ci.py $R/sweep_dflash_heldout $R/sweep_eagle3_heldout > $R/kept_ci.txt 2>&1
touch $R/DONE
python3 -m eval sweep --target /tmp/tgt --prefills 0 31979 --max-new-tokens 128 --windows trained none --num-questions 80 \
  --drafter $R/run_eagle3 --batch-size 16 --out $R/sweep_eagle3_mtbench > $R/sweep_eagle3_mtbench.log 2>&1; stamp "eagle3 mtbench rc=$?"
python3 benchmarks/sweep_kept_ci.py $R/sweep_eagle3_mtbench > $R/kept_ci_mtbench.txt 2>&1
touch $R/DONE2
