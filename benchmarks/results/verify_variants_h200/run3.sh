#!/bin/bash
# call 3: programs launched split by split (grid (B*Hkv, splits)) beside production at 1K / 8K / 32K; the descriptor
# variant's whole error; ncu on production and splits_last at 8K
R=$OUT; export PYTHONUNBUFFERED=1
timeout 300 python benchmarks/verify_attention_variants.py --contexts 8192 1024 32768 --tokens 16 1 --merge-rows \
  --variants production splits_last splits_last_keys256 splits_last_keys384 splits_last_keys1024 tma_2d production \
  --split-keys 256 384 1024 2>&1 | tee $R/variants3.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 $NCU --clock-control none --kernel-name regex:"_split" --launch-skip 0 --launch-count 12 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
  python benchmarks/verify_attention_variants.py --contexts 8192 --tokens 16 1 --merge-rows --variants production splits_last --uncaptured 2 \
  > $R/ncu3_8k.txt 2>&1; echo "ncu rc=$?"
grep -E "^  _|Duration|DRAM Throughput|SM Active Cycles|Elapsed Cycles" $R/ncu3_8k.txt | head -80
