#!/usr/bin/env bash
# Session 19, call 2: inductor's coordinate-descent tuning of its own kernels (norms, RoPE, masks, softmax) for the
# captured steps, A/B in alternating processes: the whole-block 152K DFlash row at tau 3 and its block pass alone
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res; rm -rf $R; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
stamp start
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
cd /tmp/repo
A="--compile --no-eager-baseline --attention split_kv --contexts 1024 --taus 3 --drafters dflash --dflash-draft-steps 0"

for i in 1 2; do
  python benchmarks/decode_speed.py $A --out $R/base$i.json > $R/base$i.txt 2>&1; stamp "base$i rc=$?"
  env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_tune \
    python benchmarks/decode_speed.py $A --out $R/tune$i.json > $R/tune$i.txt 2>&1; stamp "tune$i rc=$?"
done
python benchmarks/profile_decode_loop.py --dflash-block > $R/block_base.txt 2>&1; stamp "block base rc=$?"
env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_tune \
  python benchmarks/profile_decode_loop.py --dflash-block > $R/block_tune.txt 2>&1; stamp "block tune rc=$?"
touch $R/done
