#!/bin/bash
# Call 1: the split-KV kernel's pass 1 with a KV head's query rows in blocks (Tiling.block_m) against one program per
# KV head, by split size, at Qwen3-8B's heads, a 16-token verify at 8K / 1K / 32K; the kernel's GPU tests (both).
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
git log -1 --format=%H > $OUT/commit.txt
timeout 420 python benchmarks/attention_split_sizes.py --contexts 8192 1024 32768 --tokens 16 \
    --split-keys 128 256 512 768 1024 2048 > $OUT/sweep16.txt 2>&1
timeout 150 python -m pytest -q -p no:cacheprovider -o addopts="" tests/test_decode_attention.py -k "on_the_gpu and not static" > $OUT/gpu_tests.txt 2>&1
tail -3 $OUT/gpu_tests.txt; cat $OUT/sweep16.txt
