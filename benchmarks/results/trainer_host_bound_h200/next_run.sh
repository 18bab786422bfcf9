#!/bin/bash
# Setup: FA4 + hydra/omegaconf/datasets wheels as in ../fa4_custom_ops_h200/install_fa4_offline.sh (PYTHONPATH below), the
# reference target at /tmp/tgt, .dev/g holding old54207b2.tgz (git archive 54207b2) and sg_train_600.jsonl
# (python benchmarks/sharegpt_rows.py --start 200 --stop 800 --out sg_train_600.jsonl).
# NOT RUN (next session; H100 preferred): after the NumPy collate, trainer 5x with FA4 installed in both trees, one wave (compile in parallel, time one at a time):
# 54207b2 (its auto = FA4) against today in the old tree's settings, DFlash twice each, EAGLE-3 once each
# (EAGLE-3 old settings: TTT 7, no norms, AdamW; the old tree's recipe ran 16 micro-batches of one, same global batch);
# then the FA4 band GPU tests not reached
set -u
mkdir -p /tmp/g && cp .dev/g/* /tmp/g/ && cp .dev/g/sg_train_600.jsonl /tmp/sg_train_600.jsonl
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/res4; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/res4.tgz -C $R .' EXIT; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
cp .dev/g/tree.txt $R/; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf /tmp/g/old54207b2.tgz -C /tmp/old && cp benchmarks/train_throughput.py /tmp/old/benchmarks/
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
OLDE3="drafter.ttt_length=7 drafter.norm_before_fc=false drafter.norm_output=false trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/wave4; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2 exp=$3; shift 3
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 470 python3 benchmarks/train_throughput.py experiment=$exp $C "$@" \
     --serial-timing $W 6 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp old1 /tmp/old dflash_swa_small --steps 30 --warmup 10 &
tp new1 $NEW dflash_swa_small $OLD $CAP --steps 30 --warmup 10 &
tp e3old /tmp/old eagle3_swa_small --steps 20 --warmup 5 &
tp e3new $NEW eagle3_swa_small $OLDE3 target.compile_capture=true --steps 20 --warmup 5 --profile 2 &  # GPU busy against the host: is EAGLE-3 host-bound too?
tp old2 /tmp/old dflash_swa_small --steps 30 --warmup 10 &
tp new2 $NEW dflash_swa_small $OLD $CAP --steps 30 --warmup 10 &
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-6s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'] if 'host_ms_per_step' in d else '-', d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt
timeout 420 python3 -m pytest -q -o addopts="" -p no:cacheprovider -rfE tests/test_window_attention.py \
  -k "fused_diagonal or band_compiles_as_one_graph or fakes" > $R/gpu_tests.txt 2>&1
stamp "tests rc=$?"; tail -5 $R/gpu_tests.txt; cat $R/times.txt
