#!/usr/bin/env bash
# Issue 24 rerun on the refactored block pass: the 8B-shape loop at context 1K, tau 3 forced, alone on the GPU.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cd /tmp/repo
R=/tmp/res10; mkdir -p $R
echo "$(date +%H:%M:%S) decode start" >> $R/times.txt
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
timeout 420 python3 benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --contexts 1024 --taus 3 \
  --drafters dflash-vocab dflash eagle3 --out $R/decode_speed.json > $R/decode_speed.txt 2>&1
echo "$(date +%H:%M:%S) decode done rc=$?" >> $R/times.txt
touch $R/DECODE_DONE
