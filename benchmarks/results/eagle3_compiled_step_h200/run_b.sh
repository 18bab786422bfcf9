#!/bin/bash
# Call B: the shipped EAGLE-3 recipe (TTT 10, both norms, Muon; auto = FA4) compiled whole against eager, one wave;
# then the GPU tests of the compiled EAGLE-3 step and FA4's (tests/test_gpu.py) and the FA4 window cases not reached before.
set -u
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/resB; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resB.tgz -C $R .' EXIT
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
cp .dev/g/tree.txt $R/ 2>/dev/null; [ -f /tmp/sg_train_600.jsonl ] || cp .dev/g/sg_train_600.jsonl /tmp/
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
W=/tmp/waveB; rm -rf $W; mkdir -p $W
tp() { local name=$1; shift 1
  (SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 300 python3 benchmarks/train_throughput.py experiment=eagle3_swa_small $C "$@" \
     --serial-timing $W 2 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp rec_step trainer.compile_scope=step target.compile_capture=true --steps 20 --warmup 5 &
tp rec_eager trainer.compile_scope=regions target.compile_capture=true --steps 20 --warmup 5 &
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-9s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'] if 'host_ms_per_step' in d else '-', d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt
timeout 250 python3 -m pytest -q -o addopts="" -p no:cacheprovider -rfE tests/test_gpu.py -k "eagle3 or fa4" > $R/gpu_tests.txt 2>&1
stamp "gpu tests rc=$?"; tail -8 $R/gpu_tests.txt
timeout 120 python3 -m pytest -q -o addopts="" -p no:cacheprovider -rfE tests/test_window_attention.py \
  -k "fused_diagonal or band_compiles_as_one_graph" > $R/window_tests.txt 2>&1
stamp "window tests rc=$?"; tail -5 $R/window_tests.txt; cat $R/times.txt
