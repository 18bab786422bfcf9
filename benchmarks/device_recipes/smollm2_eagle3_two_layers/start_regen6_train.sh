#!/bin/bash
# one lease, the call after setup.sh (prepared 2026-12-07, thirteenth session): the whole experiment on the 6-turn data.
# pipeline.sh regenerates every ShareGPT training conversation up to its sixth user turn (1.83x the replies of the 2-turn
# files) beside the probe that compiles the step, then trains the two-layer EAGLE-3 on packed rows for
# min(MAX_STEPS, what TRAIN_S leaves) steps from the probe's compile cache and decodes the trees (1,024 nodes) on MT-Bench and
# the held-out prompts. The regenerated file is packed as soon as it is written; progress.sh returns it in the first call
# that finds it, the drafter after "all done". Carries .gl/c3 (the README's list); reports until WAIT s.
# KIND=dflash trains DFlash (pipeline.sh; fourteenth session).
# EXTRA's default is what fit one lease (eighteenth session, an H200: the regeneration in 6.7 min, 2,475 steps, the trees;
# 26.8 min of device time): replies cut at 256 tokens, 256 rows in flight. A rehearsal's EXTRA replaces it.
set -u; export T0=$(date +%s)
export EXTRA=${EXTRA:-"data.regenerate.max_new_tokens=256 data.regenerate.batch_size=256"}
CARRIED=.gl/c3 PROMPTS=sharegpt_prompts_6turns.jsonl.xz RECORDS=${RECORDS:-17268} MAX_STEPS=${MAX_STEPS:-3000} \
  bash .gl/c3/start.sh
