#!/bin/bash
# Call 1: the split-KV kernel's split sizes at six contexts (the rule was fit at 1K, 8K and 32K), one token and a
# 16-token verify, the rule's two tilings, to check split_size between and at the measured points.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 500 python benchmarks/attention_split_sizes.py --contexts 1024 2048 4096 8192 16384 32768 --tokens 1 16 \
    --split-keys 64 128 192 256 384 512 768 1024 1536 --tilings 64/4/2 64/4/3 > $OUT/sweep.txt 2>&1
cat $OUT/sweep.txt
