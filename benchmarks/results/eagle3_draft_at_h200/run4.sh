#!/bin/bash
# call 4: DFlash's block attention as the static drafter calls it (--raw), one layer at 8K: splits x warps x stages
R=$OUT; export PYTHONUNBUFFERED=1
timeout 280 python benchmarks/block_attention.py --anchors 8192 --raw --keys-per-split 64 128 192 256 512 --warps 2 4 8 --stages 1 2 3 \
  --out $R/raw8k.json > $R/raw8k.txt 2>&1; echo "rc=$?"; cat $R/raw8k.txt | tail -4 | cut -c1-3000
