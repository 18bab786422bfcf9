#!/bin/bash
# call 1: the 1-token forward against the 16-token verify kernel by kernel at 8K; o/down products with their K splits
# added inside the next norm (benchmarks/split_k_norm.py); the GPU test tier at HEAD + this change
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
timeout 120 python benchmarks/profile_decode_loop.py --context 8192 --verify-split 16 > $R/verify_split8k.txt 2>&1; echo "vs rc=$?"
grep -A27 "us per forward" $R/verify_split8k.txt | cut -c1-110
timeout 250 python benchmarks/split_k_norm.py --out $R/split_k_norm.json > $R/split_k_norm.txt 2>&1; echo "skn rc=$?"
grep -v skipped $R/split_k_norm.txt | tail -16
export SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
PYTHONPATH=/tmp/site timeout 190 python -m pytest -q -p no:cacheprovider -o addopts="" -n 4 -rfE tests/test_argmax.py \
  tests/test_block_attention.py tests/test_static_drafters.py tests/test_static_target.py tests/test_infer_gpu.py \
  tests/test_skinny_gemm.py tests/test_decode_attention.py -k "gpu or cuda or 8b_widths or captured" > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head; tail -2 $R/gpu_tests.txt
