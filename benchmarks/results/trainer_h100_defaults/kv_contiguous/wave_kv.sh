#!/bin/bash
# One cold wave (after setup.sh 1-3): 54207b2 / the tree before (kv_contiguous.diff reversed) / the tree with k and v made
# contiguous before FA4's forward (after, --profile 2), plus the key-interval GPU tests beside the compile.
set -u
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
NEW=$PWD; R=$OUT; W=/tmp/wave_kv; rm -rf $W /tmp/before; mkdir -p $W /tmp/before
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
tar cf - --exclude=./.git --exclude=./.dev . | tar xf - -C /tmp/before; (cd /tmp/before && patch -R -p1 < $NEW/.dev/kv_contiguous.diff) > $R/patch.txt 2>&1
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
tp() { local name=$1 dir=$2; shift 2
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/indkv_$name timeout 230 python3 benchmarks/train_throughput.py \
     experiment=dflash_swa_small $C "$@" --serial-timing $W 3 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name
   echo "$name rc=$rc"; python3 -c "import json; d=json.load(open('$R/$name.json')); print('%-8s %8.1f ms (host %6.1f) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$name', d['ms_per_step'], d['host_ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))" 2>/dev/null) ; }
(timeout 150 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_key_intervals_gpu.py > $R/tests.txt 2>&1; echo "tests rc=$?" >> $R/tests.txt) &
tp old /tmp/old --steps 30 --warmup 10 &
tp before /tmp/before $OLD --steps 30 --warmup 10 &
tp after $NEW $OLD --steps 30 --warmup 10 --profile 2 &
wait
tail -3 $R/tests.txt; grep -c direct_copy $R/after.txt; grep "direct_copy\|GPU busy" $R/after.txt | cut -c1-160 | head -5
