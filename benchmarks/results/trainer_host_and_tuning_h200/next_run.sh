#!/bin/bash
# Prepared for the next session (not run): after setup.sh 1-3 (the machine warm between calls), one wave of four runs:
# 54207b2, today, today with key_interval_tables.diff applied (the key-interval tables compiled: the host's ~6 ms of
# key_interval_mask in the cProfile of leaseB_pair1/cdt.txt) and coordinate-descent tuning, and that with Inductor's C++
# wrapper (TORCHINDUCTOR_CPP_WRAPPER=1; whether FA4's custom ops run under it is not known yet). A cold machine
# needs the long limit (`run timeout_s=600`): three cold compiles at once took over 300 s on lease B (leaseB_cold_timeout/); runs of one tree
# share an Inductor cache. The carrying calls leave benchmarks/results behind: copy this script, setup.sh and the diff into
# .dev/ first, then `bash .dev/next_run.sh tests` and `bash .dev/next_run.sh`.
set -u
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
HERE=$(cd "$(dirname "$0")" && pwd); R=/tmp/resN; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resN.tgz -C $R .' EXIT; NEW=$PWD
rm -rf /tmp/tables && mkdir -p /tmp/tables && tar cf - --exclude=./benchmarks/results --exclude=./.git --exclude=./.dev . | tar xf - -C /tmp/tables
(cd /tmp/tables && patch -p1 < $HERE/key_interval_tables.diff) > $R/patch.txt 2>&1
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
# `next_run.sh tests`: the diff's tests on the GPU alone (the compiled tables against eager; the FA4 step against SDPA's
# dense masks), a call of their own; `next_run.sh` the wave
[ "${1:-}" = tests ] && { (cd /tmp/tables && timeout 500 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_key_intervals.py tests/test_gpu.py \
   -k "compiled_plan or fa4_compiled_training_step_equals_dense_masks" > $R/tests.txt 2>&1; echo "tests rc=$?" >> $R/tests.txt); cat $R/tests.txt; exit; }
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/waveN; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2 cache=$3; shift 3
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$cache timeout 560 python3 benchmarks/train_throughput.py \
     experiment=dflash_swa_small $C "$@" --serial-timing $W 4 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp old /tmp/old old --steps 30 --warmup 10 &
tp new $NEW new $OLD $CAP --steps 30 --warmup 10 &
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 tp tables_cdt /tmp/tables tables_cdt $OLD $CAP --steps 30 --warmup 10 --cprofile 10 &
# and Inductor's C++ wrapper (the compiled graphs launch their ~430 kernels a step from C++, not Python: the host's share)
TORCHINDUCTOR_CPP_WRAPPER=1 TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 tp tables_cdt_cpp /tmp/tables tables_cdt_cpp $OLD $CAP --steps 30 --warmup 10 --profile 2 &
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json; d=json.load(open('$f')); print('%-10s %8.1f ms (host %6.1f) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['ms_per_step'], d['host_ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt $R/times.txt $R/patch.txt
