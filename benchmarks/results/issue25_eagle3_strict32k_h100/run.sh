#!/usr/bin/env bash
# Issue 25's 32K goal for EAGLE-3 under the strict reading (not yet run): the reference target, eagle3_swa_small on 3,000
# regenerated conversations (~1,000 steps or 9 minutes), then all 80 MT-Bench questions at prefill 0 and behind 31,979
# filler tokens (every prompt >= 32,000 tokens), 128 new tokens a turn, windows trained and none, batch 16, prompt
# lookup's cells beside: DFlash's run of the same goal, benchmarks/results/issue25_strict32k_h100/. ~20 device minutes.
# Calls: (1) carry .dev/w .dev/tgtB: pip install --target /tmp/site .dev/w/*.whl, cp .dev/tgtB/* /tmp/tgt/;
# (2) carry .dev/tgtA .dev/hp: cp into /tmp/tgt and /tmp/hp, the tree to /tmp/repo with cp -r (not git ls-files: the
# device's .git can be an older commit's); (3) carry .dev/pf4 (the 4-turn ShareGPT prompt file): cp to /tmp/pf4, then
# setsid this script; wait-loop calls that tar /tmp/res21 into $OUT. Smoke-tested on the CPU with the pipeline's small
# settings (KINDS=eagle3 SKIP_EVAL=1 SWEEP_QUESTIONS=2 EVAL_TOKENS=16, 2 steps, LONG=600).
# The prompt files: python benchmarks/sharegpt_prompt_files.py --out DIR --max-turns 4 (DIR/sharegpt_prompts.jsonl is
# .dev/pf4's, DIR/sharegpt_heldout_prompts.jsonl .dev/hp's: the same bytes, checked with md5sum).
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
# the pipeline calls python: a wrapper, not a symlink (a symlink to a venv's python starts the base interpreter, without
# the venv's packages)
if ! command -v python > /dev/null; then
  mkdir -p /tmp/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/bin/python && chmod +x /tmp/bin/python
  export PATH=/tmp/bin:$PATH
fi
cd /tmp/repo
R=/tmp/res21; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
KINDS=eagle3 SKIP_EVAL=1 SWEEP_QUESTIONS=80 EVAL_TOKENS=128 \
EAGLE3_ARGS="trainer.max_steps=1000 trainer.time_limit_minutes=9 trainer.checkpoint_every=250 trainer.eval_every=100000 trainer.loop_eval_prompts=0" \
bash benchmarks/small_target_pipeline.sh /tmp/tgt /tmp/pf4/sharegpt_prompts.jsonl /tmp/hp/sharegpt_heldout_prompts.jsonl $R 31979 -- \
  data.max_records=3000
# the kept ratios' intervals, as for DFlash
python3 benchmarks/sweep_kept_ci.py $R/sweep_eagle3 > $R/kept_ci.txt 2>&1
touch $R/ALL_DONE  # the pipeline writes DONE before the line above: wait for this one
