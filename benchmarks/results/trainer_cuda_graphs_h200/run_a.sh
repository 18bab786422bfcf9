#!/bin/bash
# Call A: trainer.cuda_graphs (the compiled step replayed as CUDA graphs) on the reference target, FA4 installed in both
# trees, one wave (compile in parallel, time one at a time: train_throughput --serial-timing):
#   DFlash in the old tree's settings: 54207b2 (its auto = FA4) twice, today's with cuda_graphs twice, without once;
#   EAGLE-3 in the old tree's settings with and without cuda_graphs; --sync-debug on the graphed runs;
# then the GPU tests of the graphed step (tests/test_gpu.py -k cuda_graph). Setup: setup.sh.
set -u
# datasets 4.4.1 imports torchvision.io.VideoReader to format rows once torchvision is imported; the image's torchvision
# has none (ImportError in the NumPy formatter): datasets told torchvision is absent, on this machine only
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/resA; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resA.tgz -C $R .' EXIT; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
git_head=$(cat .dev/tree.txt 2>/dev/null); echo "tree $git_head" > $R/tree.txt
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
OLDE3="drafter.ttt_length=7 drafter.norm_before_fc=false drafter.norm_output=false trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/waveA; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2 exp=$3; shift 3
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 420 python3 benchmarks/train_throughput.py experiment=$exp $C "$@" \
     --serial-timing $W 7 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp old1 /tmp/old dflash_swa_small --steps 30 --warmup 10 &
tp cg1 $NEW dflash_swa_small $OLD $CAP trainer.cuda_graphs=true --steps 30 --warmup 10 --sync-debug &
tp nocg $NEW dflash_swa_small $OLD $CAP --steps 30 --warmup 10 &
tp e3cg $NEW eagle3_swa_small $OLDE3 $CAP trainer.cuda_graphs=true --steps 20 --warmup 5 --sync-debug &
tp e3nocg $NEW eagle3_swa_small $OLDE3 $CAP --steps 20 --warmup 5 &
tp old2 /tmp/old dflash_swa_small --steps 30 --warmup 10 &
tp cg2 $NEW dflash_swa_small $OLD $CAP trainer.cuda_graphs=true --steps 30 --warmup 10 &
( while sleep 20; do nvidia-smi --query-gpu=memory.used --format=csv,noheader >> $R/mem.txt; done ) & MON=$!
wait %1 %2 %3 %4 %5 %6 %7; kill $MON; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-8s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'] if 'host_ms_per_step' in d else '-', d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
cat $R/summary.txt; grep -h "loss by step" $R/cg1.txt $R/nocg.txt $R/e3cg.txt $R/e3nocg.txt | cut -c1-160
grep -h -A12 "^SYNC\|sync" $R/cg1.txt $R/e3cg.txt | head -40
grep -h "Error\|error" $R/*.txt | sort | uniq -c | sort -rn | head -10
timeout 150 python3 -m pytest -q -o addopts="" -p no:cacheprovider -rfE tests/test_gpu.py -k "cuda_graph" > $R/gpu_tests.txt 2>&1
stamp "gpu tests rc=$?"; tail -8 $R/gpu_tests.txt; cat $R/times.txt
