#!/bin/bash
# call 1: the verify attention's variants side by side (36 calls captured), then ncu on the production kernel and the
# TMA variant at 8K (one token, 16 tokens), one uncaptured call each after a warm-up
R=$OUT; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
python -c "import triton, torch; print(triton.__version__, torch.__version__)" >> $R/gpu.txt
timeout 300 python benchmarks/verify_attention_variants.py --contexts 1024 8192 32768 --tokens 1 16 2>&1 | tee $R/variants.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" >> $R/gpu.txt
timeout 200 $NCU --clock-control none --kernel-name regex:"_split|_merge" --launch-skip 0 --launch-count 40 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section WarpStateStats \
  python benchmarks/verify_attention_variants.py --contexts 8192 --tokens 1 16 --variants production tma --uncaptured 3 \
  > $R/ncu_8k.txt 2>&1; echo "ncu rc=$?"
grep -E "^  _|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Shared Memory Config|Grid Size|Waves Per SM|Theoretical Occ" $R/ncu_8k.txt | head -120
