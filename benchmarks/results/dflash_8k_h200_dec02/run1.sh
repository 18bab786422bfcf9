#!/bin/bash
# call 2: the few-row products that stay on cuBLAS (o_proj 4096x4096, down 4096x12288, DFlash's fc 4096x20480) against the
# Triton kernel over a grid (4 warps, 3-4 stages; 128-program tilings allowed), 20 distinct copies read in turn (as a
# forward's layers: no matrix served from L2); the tuned shapes too, for their H200 figures. Then the DFlash loop at 8K
# twice more (issue 24's thin 8K margin), one process each.
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; git log -1 --format=%H >> $R/gpu.txt
timeout 330 python benchmarks/skinny_gemm.py --copies 20 --warps 4 --stages 3 4 --shapes wo w2 dflash_fc wqkv w13 --rows 1 16 \
  --out $R/skinny.json > $R/skinny.txt 2>&1; echo "skinny rc=$?"
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
for i in 1 2; do
  timeout 110 python benchmarks/decode_speed.py $A --out $R/d8k_$i.json > $R/d8k_$i.txt 2>&1; echo "8K $i rc=$?"
done
grep -h "speedup\|dflash" $R/d8k_*.txt | tail -6
cat $R/skinny.txt | grep -v skipped
