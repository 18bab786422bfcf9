#!/bin/bash
# call 1 (HEAD 8c994e7 + the --step-timeline option): one DFlash step at 8K, every GPU event, τ = 3 forced
R=$OUT; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
timeout 200 python benchmarks/profile_decode_loop.py --context 8192 --drafter dflash --tau 3 --tokens 96 \
  --step-timeline $R/step8k.txt > $R/prof8k.txt 2>&1; echo "rc=$?"; grep -A14 "one step" $R/prof8k.txt; grep "dflash τ" $R/prof8k.txt
