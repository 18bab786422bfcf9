#!/bin/bash
# FA4 as custom ops: the trainer's throughput with FA4 (auto) and flex beside 54207b2 (its FA4 path graph-breaks),
# the shipped recipes both ways (DFlash, EAGLE-3); then the new compile tests. Results tarred into $OUT at the end.
set -u
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/resB; rm -rf $R; mkdir -p $R; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
finish() { tar czf $OUT/resB.tgz -C $R . ; }
trap finish EXIT
stamp start
git rev-parse HEAD > $R/commit.txt 2>/dev/null; git status --short >> $R/commit.txt 2>/dev/null
rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf .dev/g/old54207b2.tgz -C /tmp/old && cp benchmarks/train_throughput.py /tmp/old/benchmarks/
cp .dev/g/sg_train_600.jsonl /tmp/sg_train_600.jsonl
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
python3 -c "from kernels import fa4_adapter as a; print(a.installed_version(), a.check(), a.available())" > $R/fa4_check.txt 2>&1
stamp "fa4 check rc=$?"
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
A="--steps 30 --warmup 10"
tp() {  # name code-dir wave-dir runs-in-wave experiment overrides...
  local name=$1 dir=$2 wave=$3 n=$4 exp=$5; shift 5
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 250 python3 benchmarks/train_throughput.py experiment=$exp $C "$@" $A \
     --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=/tmp/waveb1; rm -rf $W; mkdir -p $W
tp old /tmp/old $W 4 dflash_swa_small &
tp new $NEW $W 4 dflash_swa_small $OLD $CAP &
tp newflex $NEW $W 4 dflash_swa_small $OLD $CAP trainer.attention_backend=flex &
tp recipe $NEW $W 4 dflash_swa_small target.compile_capture=true &
wait; stamp "wave1 done"
W=/tmp/waveb2; rm -rf $W; mkdir -p $W
tp oldflex /tmp/old $W 4 dflash_swa_small trainer.attention_backend=flex &
tp new_b $NEW $W 4 dflash_swa_small $OLD $CAP &
tp old_b /tmp/old $W 4 dflash_swa_small &
tp recipeflex $NEW $W 4 dflash_swa_small target.compile_capture=true trainer.attention_backend=flex &
wait; stamp "wave2 done"
W=/tmp/waveb3; rm -rf $W; mkdir -p $W
tp e3 $NEW $W 3 eagle3_swa_small target.compile_capture=true &
tp e3flex $NEW $W 3 eagle3_swa_small target.compile_capture=true trainer.attention_backend=flex &
tp e3old /tmp/old $W 3 eagle3_swa_small &
wait; stamp "wave3 done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-12s %-6s %8.1f ms %10.0f tok/s  loss[0,-1] %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt
timeout 170 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_key_intervals_gpu.py tests/test_window_attention.py -k "one_graph" > $R/gpu_tests_graph.txt 2>&1
stamp "graph tests rc=$?"
tail -15 $R/gpu_tests_graph.txt
cat $R/times.txt
