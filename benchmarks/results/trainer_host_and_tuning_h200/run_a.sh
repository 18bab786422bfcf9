#!/bin/bash
# Call 3 (after setup.sh 3): DFlash in the old tree's settings, FA4 in both trees, one wave (compile in parallel, time one
# at a time): 54207b2; today's default (+ a profile of 2 steps, every kernel by name); today's with Inductor's
# coordinate-descent tuning; today's with max-autotune (GEMM templates and pointwise) + coordinate descent.
set -u
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/res$1; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/res$1.tgz -C $R .' EXIT; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
echo "tree $(cat .dev/tree.txt)" > $R/tree.txt
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/wave$1; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2; shift 2
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$name timeout ${TMO:-470} python3 benchmarks/train_throughput.py \
     experiment=dflash_swa_small $C "$@" --serial-timing $W $NRUNS --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
NRUNS=4
case $1 in
A) tp old /tmp/old --steps 30 --warmup 10 &
   tp new $NEW $OLD $CAP --steps 30 --warmup 10 --profile 2 &
   TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 tp cdt $NEW $OLD $CAP --steps 30 --warmup 10 &
   ;;
A2) NRUNS=3; TMO=320
   tp old /tmp/old --steps 30 --warmup 10 &
   tp new $NEW $OLD $CAP --steps 30 --warmup 10 --profile 2 &
   TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 tp cdt $NEW $OLD $CAP --steps 30 --warmup 10 & ;;
A3) NRUNS=3; TMO=300
   tp old /tmp/old --steps 30 --warmup 10 &
   tp new $NEW $OLD $CAP --steps 30 --warmup 10 &
   TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 tp cdt $NEW $OLD $CAP --steps 30 --warmup 10 --cprofile 10 & ;;
B) source .dev/wave_b.sh ;;
esac
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-8s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt; cat $R/times.txt; grep -h "GPU busy" $R/*.txt
