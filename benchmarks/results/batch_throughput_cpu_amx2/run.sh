#!/bin/bash
# A second 2-core Intel Xeon with AMX (lscpu.txt: amx_bf16, amx_int8, avx512_bf16; 105 MiB L3, under the reference
# target's 108 MB of fp32 weights), the repository root, the CI venv. Prompt lookup with 15 drafts, fp32, 128 new tokens
# a turn, batch 1 on 2 threads against batch 8 over eval's two one-thread workers (the default), interleaved pairs;
# then batch 8 in one two-thread process (--cpu-workers 1) against the workers, four pairs each, one after the other.
B="python benchmarks/batch_throughput.py --target ../shared/targets/qwen3-27m-sharegpt --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --interleave --only pld --pld-drafts 15"
$B --questions 80 --repeat 2 > q80_pld.txt
$B --questions 16 --repeat 3 > q16_pld.txt
$B --questions 16 --repeat 4 --cpu-workers 1 > q16_w1.txt
$B --questions 16 --repeat 4 > q16_w2.txt
