#!/bin/bash
# call C: one wave (compile in parallel, time one at a time): EAGLE-3's recipe on FA4 and on flex; DFlash in the old
# tree's settings on FA4 and flex with a profile of 2 steps (where the step's time goes)
set -u
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/res3; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/res3.tgz -C $R .' EXIT
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/wave3; rm -rf $W; mkdir -p $W
tp() { local name=$1 lim=$2 exp=$3; shift 3
  (SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout $lim python3 benchmarks/train_throughput.py experiment=$exp $C "$@" \
     --serial-timing $W 4 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp e3fa4 520 eagle3_swa_small target.compile_capture=true trainer.attention_backend=fa4 --steps 20 --warmup 5 &
tp e3flex 520 eagle3_swa_small target.compile_capture=true trainer.attention_backend=flex --steps 20 --warmup 5 &
tp dfa4 520 dflash_swa_small $OLD $CAP trainer.attention_backend=fa4 --steps 30 --warmup 10 --profile 2 &
tp dflex 520 dflash_swa_small $OLD $CAP trainer.attention_backend=flex --steps 30 --warmup 10 --profile 2 &
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-8s %-6s %8.1f ms %10.0f tok/s  loss[0,-1] %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt $R/times.txt
