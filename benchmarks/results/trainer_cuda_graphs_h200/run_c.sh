#!/bin/bash
# Call C (a fresh machine, setup.sh again): trainer.cuda_graphs over stable input buffers (train/step_graphs.py after
# call A's diagnosis: the backward re-recorded every step because the key-interval tables came at new addresses), DFlash
# in the old tree's settings, FA4 in both trees, one wave: 54207b2, today's with cuda_graphs (and --sync-debug), without.
set -u
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py  # as in run_a.sh
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/resC; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resC.tgz -C $R .' EXIT; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
echo "tree $(cat .dev/tree.txt 2>/dev/null)" > $R/tree.txt
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/waveC; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2; shift 2
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 280 python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" \
     --serial-timing $W 3 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp old1 /tmp/old --steps 30 --warmup 10 &
TORCH_LOGS=cudagraphs tp cg1 $NEW $OLD $CAP trainer.cuda_graphs=true --steps 30 --warmup 10 --sync-debug &
tp nocg $NEW $OLD $CAP --steps 30 --warmup 10 &
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-8s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'] if 'host_ms_per_step' in d else '-', d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt; grep -h "loss by step" $R/cg1.txt $R/nocg.txt | cut -c1-200
grep -h "Error" $R/cg1.txt | sort | uniq -c | head -5; grep -c "Re-recording" $R/cg1.txt; cat $R/times.txt
