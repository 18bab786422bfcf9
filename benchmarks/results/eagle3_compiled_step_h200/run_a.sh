#!/bin/bash
# Call A: issue 25's trainer 5x with FA4 installed in both trees after the NumPy collate (DFlash, two same-wave pairs),
# and EAGLE-3's step compiled whole against the old tree and against itself eager (old tree's settings), one wave:
# compile in parallel, time one at a time (train_throughput --serial-timing). Setup as in
# ../trainer_host_bound_h200/next_run.sh (FA4 + hydra wheels in /tmp/site, the target at /tmp/tgt, .dev/g).
set -u
mkdir -p /tmp/g && cp .dev/g/* /tmp/g/ && cp .dev/g/sg_train_600.jsonl /tmp/sg_train_600.jsonl
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/resA; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resA.tgz -C $R .' EXIT; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
cp .dev/g/tree.txt $R/; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf /tmp/g/old54207b2.tgz -C /tmp/old && cp benchmarks/train_throughput.py /tmp/old/benchmarks/
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
OLDE3="drafter.ttt_length=7 drafter.norm_before_fc=false drafter.norm_output=false trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/waveA; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2 exp=$3; shift 3
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 540 python3 benchmarks/train_throughput.py experiment=$exp $C "$@" \
     --serial-timing $W 7 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp old1 /tmp/old dflash_swa_small --steps 30 --warmup 10 &
tp new1 $NEW dflash_swa_small $OLD $CAP --steps 30 --warmup 10 &
tp e3old /tmp/old eagle3_swa_small --steps 20 --warmup 5 &
tp e3new $NEW eagle3_swa_small $OLDE3 $CAP --steps 20 --warmup 5 --profile 2 &
tp e3eager $NEW eagle3_swa_small $OLDE3 trainer.compile_scope=regions target.compile_capture=true --steps 20 --warmup 5 &
tp old2 /tmp/old dflash_swa_small --steps 30 --warmup 10 &
tp new2 $NEW dflash_swa_small $OLD $CAP --steps 30 --warmup 10 &
( while sleep 20; do nvidia-smi --query-gpu=memory.used --format=csv,noheader >> $R/mem.txt; done ) & MON=$!
wait %1 %2 %3 %4 %5 %6 %7; kill $MON; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-8s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'] if 'host_ms_per_step' in d else '-', d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt; cat $R/times.txt; grep -h "loss by step" $R/e3*.txt | cut -c1-200
