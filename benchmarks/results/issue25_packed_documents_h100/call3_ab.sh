#!/bin/bash
# call 3: SmolLM2 EAGLE-3 trainer tokens/s, one conversation per row against packed documents (same data), then GPU tests
set -u; T0=$(date +%s); export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache
R=/tmp/ab; rm -rf $R /tmp/wab; mkdir -p $R /tmp/wab; trap 'tar czf $OUT/ab.tgz -C $R .' EXIT
stamp() { echo "$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a $R/times.txt; }
C="experiment=eagle3_swa_small target.path=builtin:smollm2-135m-instruct data.path=/tmp/pf/sharegpt_prompts.jsonl data.max_records=12000 drafter.draft_vocab_size=16384 trainer.attention_backend=flex"
stamp start
(timeout 530 python3 benchmarks/train_throughput.py $C --steps 15 --warmup 3 --serial-timing /tmp/wab 2 --json $R/rows.json > $R/rows.txt 2>&1; stamp "rows rc=$?") &
(timeout 530 python3 benchmarks/train_throughput.py $C data.pack_documents=true data.pack_length=2048 --steps 15 --warmup 3 --serial-timing /tmp/wab 2 --json $R/packed.json > $R/packed.txt 2>&1; stamp "packed rc=$?") &
wait; stamp done
