#!/bin/bash
# one call after setup.sh: SmolLM2's regeneration of every ShareGPT training conversation with up to 6 user turns
# (REGEN_ONLY, to return the file), and beside it the cold compiles of SmolLM2's EAGLE-3 step (flex with 8 soft-CE chunks a
# TTT step, flex with 1, sdpa with 1: compile_run.sh, a copy of benchmarks/results/eagle3_compile_chunks_gpu/run.sh).
# Reports until WAIT s. (With NO_COMPILE=1 the compile cases are left out; a CPU rehearsal: NO_COMPILE=1 RECORDS=2 WAIT=5.)
set -u; export T0=$(date +%s)
[ -n "${NO_COMPILE:-}" ] || ( mkdir -p /tmp/cc_out; WAIT=1 OUT=/tmp/cc_out bash .gl/c3/compile_run.sh > /tmp/cc_start.txt 2>&1 )
CARRIED=.gl/c3 PROMPTS=sharegpt_prompts_6turns.jsonl.xz PROGRESS=progress_regen6.sh REGEN_ONLY=1 RECORDS=${RECORDS:-17268} \
  bash .gl/c3/start.sh
