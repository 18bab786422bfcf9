#!/bin/bash
# call E (carries .dev/g): flex only (no FA4 install, little device time left): the tree before the NumPy collate
# (8fe8ae3), after it (this tree) and 54207b2, DFlash in the old tree's settings, one wave, timed one at a time
set -u
mkdir -p /tmp/g && cp .dev/g/* /tmp/g/ && cp .dev/g/sg_train_600.jsonl /tmp/sg_train_600.jsonl
export PYTHONUNBUFFERED=1
R=/tmp/res5; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/res5.tgz -C $R .' EXIT; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
cp .dev/g/tree.txt $R/; nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
rm -rf /tmp/old /tmp/b8f && mkdir -p /tmp/old /tmp/b8f && tar xzf /tmp/g/old54207b2.tgz -C /tmp/old && tar xzf /tmp/g/b8f.tgz -C /tmp/b8f && cp benchmarks/train_throughput.py /tmp/old/benchmarks/
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16 trainer.attention_backend=flex"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/wave5; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2; shift 2
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 140 python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" \
     --steps 30 --warmup 10 --serial-timing $W 3 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc"; tar czf $OUT/res5.tgz -C $R .) ; }
stamp start
tp before /tmp/b8f $OLD $CAP &
tp after $NEW $OLD $CAP &
tp old /tmp/old &
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-6s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'] if 'host_ms_per_step' in d else '-', d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt $R/times.txt
