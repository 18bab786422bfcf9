#!/bin/bash
# This session's wave (after setup.sh 1-3, the machine warm): 54207b2 / HEAD (/tmp/base: row_stats.diff reversed) /
# the working tree (the CE forward's one-pass Triton kernel) / that + key_interval_tables.diff + coordinate-descent tuning.
set -u
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
HERE=$(cd "$(dirname "$0")" && pwd); R=/tmp/resN; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resN.tgz -C $R .' EXIT; NEW=$PWD
copy() { rm -rf $1 && mkdir -p $1 && tar cf - --exclude=./benchmarks/results --exclude=./.git --exclude=./.dev . | tar xf - -C $1; }
copy /tmp/tables; (cd /tmp/tables && patch -p1 < $HERE/key_interval_tables.diff) > $R/patch.txt 2>&1
copy /tmp/base; (cd /tmp/base && patch -R -p1 < $HERE/row_stats.diff && rm -f kernels/row_stats.py tests/test_row_stats.py) >> $R/patch.txt 2>&1
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
if [ "${1:-}" = tests ]; then
  (cd /tmp/tables && timeout 520 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_row_stats.py tests/test_cross_entropy.py tests/test_key_intervals.py tests/test_gpu.py \
     -k "on_a_gpu or compiled_cross_entropy_with_the_kernel or compiled_plan or fa4_compiled_training_step_equals_dense_masks" > $R/tests.txt 2>&1; echo "tests rc=$?" >> $R/tests.txt)
  (cd $NEW && timeout 60 python3 benchmarks/row_stats_speed.py > $R/row_stats_speed.txt 2>&1); cat $R/tests.txt | tail -30; cat $R/row_stats_speed.txt; exit
fi
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/waveN; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2; shift 2
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$name timeout 560 python3 benchmarks/train_throughput.py \
     experiment=dflash_swa_small $C "$@" --serial-timing $W 4 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp old /tmp/old --steps 30 --warmup 10 &
tp base /tmp/base $OLD $CAP --steps 30 --warmup 10 &
tp ce $NEW $OLD $CAP --steps 30 --warmup 10 --profile 2 &
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 tp tables_ce_cdt /tmp/tables $OLD $CAP --steps 30 --warmup 10 --cprofile 10 &
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json; d=json.load(open('$f')); print('%-14s %8.1f ms (host %6.1f) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['ms_per_step'], d['host_ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt $R/times.txt $R/patch.txt
