#!/bin/bash
# Call C (a fresh machine, set up as before): run_b.sh's recipe wave timed out at 300 s in both runs (the compiled one
# still compiling; the eager one waiting at the barrier). Again with 560 s, recompiles logged, a stack dump at 520 s.
set -u
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/resC; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resC.tgz -C $R .' EXIT
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
cp .dev/g/tree.txt $R/ 2>/dev/null; [ -f /tmp/sg_train_600.jsonl ] || cp .dev/g/sg_train_600.jsonl /tmp/
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
W=/tmp/waveC; rm -rf $W; mkdir -p $W
tp() { local name=$1; shift 1
  (SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCH_LOGS=recompiles timeout -s USR1 -k 20 520 python3 benchmarks/train_throughput.py \
     experiment=eagle3_swa_small $C "$@" --serial-timing $W 2 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?
   [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp rec_step trainer.compile_scope=step target.compile_capture=true --steps 20 --warmup 5 &
tp rec_eager trainer.compile_scope=regions target.compile_capture=true --steps 20 --warmup 5 &
( while sleep 30; do echo "$(date +%H:%M:%S) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)" >> $R/mem.txt; done ) & MON=$!
wait %1 %2; kill $MON; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-9s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'] if 'host_ms_per_step' in d else '-', d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt $R/times.txt; grep -h "loss by step" $R/*.txt | cut -c1-220
