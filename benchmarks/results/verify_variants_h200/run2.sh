#!/bin/bash
# call 2: the 2-D descriptor variant, split sizes and 8 warps beside production at 8K and 32K; ncu on production and
# tma_2d at 8K, 16 tokens
R=$OUT; export PYTHONUNBUFFERED=1
timeout 300 python benchmarks/verify_attention_variants.py --contexts 8192 32768 --tokens 1 16 --merge-rows \
  --variants production tma tma_2d keys256 keys1024 tma_2d_keys256 tma_2d_keys1024 tiling64/8/3 tiling64/4/4 \
  --tilings 64/8/3 64/4/4 --split-keys 256 1024 2>&1 | tee $R/variants2.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 $NCU --clock-control none --kernel-name regex:"_split" --launch-skip 0 --launch-count 12 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
  python benchmarks/verify_attention_variants.py --contexts 8192 --tokens 16 --merge-rows --variants production tma_2d --uncaptured 2 \
  > $R/ncu2_8k.txt 2>&1; echo "ncu rc=$?"
grep -E "^  _|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|No Eligible" $R/ncu2_8k.txt | head -80
