#!/bin/bash
set -u
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/resC; rm -rf $R; mkdir -p $R; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
finish() { tar czf $OUT/resC.tgz -C $R . ; }
trap finish EXIT
stamp start; git rev-parse HEAD > $R/commit.txt
cp .dev/g/sg_train_600.jsonl /tmp/sg_train_600.jsonl
timeout 250 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_key_intervals_gpu.py tests/test_window_attention.py tests/test_gpu.py -k "one_graph or fa4 or key_interval" > $R/gpu_tests.txt 2>&1
stamp "tests rc=$?"; tail -4 $R/gpu_tests.txt
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
tp() { local name=$1 wave=$2 n=$3; shift 3
  (SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 180 python3 benchmarks/train_throughput.py experiment=eagle3_swa_small $C "$@" --steps 20 --warmup 5 \
     --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=/tmp/wavec; rm -rf $W; mkdir -p $W
tp e3 $W 2 target.compile_capture=true &
tp e3cudnn $W 2 target.compile_capture=true trainer.attention_backend=cudnn &
wait
for f in $R/*.json; do python3 -c "import json; d=json.load(open('$f')); print('%-10s %-6s %8.1f ms %9.0f tok/s loss[0,-1] %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][-1]))"; done | tee $R/summary.txt
cat $R/times.txt
