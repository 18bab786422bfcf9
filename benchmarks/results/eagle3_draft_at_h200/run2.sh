#!/bin/bash
# call 2: the GPU tier at this tree (draft_at's GPU tests included), then EAGLE-3 at 8K and DFlash's whole block at 8K
R=$OUT; export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site
export SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
python3 -c "import hydra" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
timeout 300 python -m pytest -q -p no:cacheprovider -o addopts="" -n 4 tests/test_argmax.py tests/test_block_attention.py \
  tests/test_static_drafters.py tests/test_static_target.py tests/test_infer_gpu.py tests/test_skinny_gemm.py \
  tests/test_decode_attention.py tests/test_static_eagle3.py -k "gpu or cuda or 8b_widths or captured" > $R/gpu_tests.txt 2>&1
echo "tests rc=$?"; tail -3 $R/gpu_tests.txt
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3"
timeout 120 python $CMD --drafters eagle3 --contexts 8192 > $R/e3_8k.txt 2>&1; echo "e3 8k rc=$?"
grep -E "^static|^eagle" $R/e3_8k.txt | cut -c1-160
timeout 120 python $CMD --drafters dflash --contexts 8192 > $R/dflash_8k.txt 2>&1; echo "dflash 8k rc=$?"
grep -E "^static|^dflash" $R/dflash_8k.txt | cut -c1-160
