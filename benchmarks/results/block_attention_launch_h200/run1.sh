#!/bin/bash
# call 1: pass 1's launch settings of DFlash's block attention (warps × stages × keys a split) at 8K and 32K, then the
# DFlash whole block (bf16, the 152K head) at τ = 3, 8K, twice with the defaults (this lease's baseline)
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; git log -1 --format=%H >> $R/gpu.txt
timeout 330 python benchmarks/block_attention.py --anchors 8192 32768 --keys-per-split 64 128 256 --warps 2 4 8 \
  --stages 1 2 3 > $R/sweep.txt 2>&1; echo "sweep rc=$?"
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
for i in 1 2; do
  timeout 110 python benchmarks/decode_speed.py $A --out $R/d8k_$i.json > $R/d8k_$i.txt 2>&1; echo "8K $i rc=$?"
done
grep -h "speedup\|dflash" $R/d8k_*.txt | tail -6
cat $R/sweep.txt
