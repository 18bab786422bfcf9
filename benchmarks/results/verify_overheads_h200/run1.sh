#!/bin/bash
# call 1: where a 16-token verify's extra time goes on an H200 (1K, 8K), the DFlash block pass at 8K, the split sweep at 8K
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
git log --oneline -1 > $R/tree.txt
for c in 8192 1024; do
  timeout 150 python benchmarks/profile_decode_loop.py --verify-split 16 --context $c > $R/verify_split_$c.txt 2>&1; echo "verify_split $c rc=$?"
done
timeout 120 python benchmarks/profile_decode_loop.py --dflash-block --context 8192 > $R/block_8192.txt 2>&1; echo "block rc=$?"
timeout 90 python benchmarks/attention_split_sizes.py --contexts 8192 --tokens 1 4 16 > $R/splits_8192.txt 2>&1; echo "splits rc=$?"
