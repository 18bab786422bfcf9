#!/bin/bash
# one call after setup.sh and `CARRIED=.gl/c3 PROMPTS=sharegpt_prompts_6turns.jsonl.xz REGEN_ONLY=1 RECORDS=1 WAIT=120
# bash .gl/c3/start.sh` (which put the target and the prompt files in place), nothing else on the GPU (sixteenth
# session): where the 6-turn regeneration's time goes. The one-lease recipe's 256-token regeneration took 17.5 min with
# the GPU 0-40% busy; it has to take ~7 for the regeneration, 3,000 steps and the trees to share one lease.
# benchmarks/profile_regen.py: the captured step's time by rows and position, then NUM conversations regenerated with
# the step and the prefill waves timed (device-synchronising timers: an upper bound of a plain run), for each of CASES
# and BATCHES.
set -u; cd ${REPO:-/tmp/repo_snapshot}; export PYTHONUNBUFFERED=1 PYTHONPATH=${SITE:-/tmp/site} SWA_DRAFTERS_CACHE=${CACHE:-/tmp/swacache}
O=${OUT:-/tmp}/profile_regen.md; : > $O
# CASES: reuse_turns:run_ahead:timers. Turn by turn is how the sixteenth session's lease regenerated; turns reused
# in their rows is the default since; runs queued ahead (off by default) are judged by a plain run's wall time (no
# synchronising timers, which would remove the overlap they are for)
steps=""
for case in ${CASES:-off:off:on on:off:on on:off:off on:on:off}; do for b in ${BATCHES:-128 256}; do
  IFS=: read reuse ahead timers <<< "$case"
  python3 benchmarks/profile_regen.py --target builtin:smollm2-135m-instruct --data /tmp/pf/sharegpt_prompts.jsonl \
    --num ${NUM:-600} --max-new-tokens ${MAX_NEW:-256} --batch-size $b --run-steps ${RUN_STEPS:-8} --device ${DEVICE:-cuda} \
    --reuse-turns $reuse $([ $ahead = on ] && echo --run-ahead) $([ $timers = off ] && echo --no-timers) $steps \
    ${PROFILE_EXTRA:-} 2>&1 | grep -v "Loading weights" | tee -a $O
  steps="--step-batches"  # the step table once
done; done
