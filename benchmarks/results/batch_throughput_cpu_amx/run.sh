#!/bin/bash
# A 2-core Intel Xeon with AMX (lscpu: avx512_bf16, amx_bf16, amx_int8, amx_tile), the repository root, the venv active.
# No DFlash drafter for the reference target was at hand (exports are not committed): prompt lookup with 15 drafts (a DFlash
# block's) and the target alone, fp32 as eval runs the CPU; then prompt lookup in bf16 (AMX) on 16 conversations, once.
B="python benchmarks/batch_throughput.py --target ../shared/targets/qwen3-27m-sharegpt --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --interleave"
$B --questions 80 --repeat 2 --only pld --pld-drafts 15 > q80_pld.txt
$B --questions 16 --repeat 2 --only alone pld --pld-drafts 15 > q16_alone_pld.txt
$B --questions 16 --repeat 1 --only pld --pld-drafts 15 --dtype bfloat16 > q16_pld_bf16.txt
