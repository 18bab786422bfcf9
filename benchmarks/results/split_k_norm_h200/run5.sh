#!/bin/bash
# call 5: the GPU test tier at the session's final tree, then the loop at 8K twice more (o/down through the kernel)
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
PYTHONPATH=/tmp/site timeout 230 python -m pytest -q -p no:cacheprovider -o addopts="" -n 4 -rfE tests/test_argmax.py \
  tests/test_block_attention.py tests/test_static_drafters.py tests/test_static_target.py tests/test_infer_gpu.py \
  tests/test_skinny_gemm.py tests/test_decode_attention.py tests/test_static_eagle3.py \
  -k "gpu or cuda or 8b_widths or captured" > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head; tail -1 $R/gpu_tests.txt
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
run() { timeout 100 python benchmarks/decode_speed.py $A > $R/$1.txt 2>&1; echo "$1 rc=$?"; grep -E "^static|forward at|^dflash" $R/$1.txt | cut -c1-150; }
run final_1; run final_2
