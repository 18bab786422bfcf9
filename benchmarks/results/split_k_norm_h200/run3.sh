#!/bin/bash
# call 3: the few-row products' tilings with their sums' order kept (TUNED block_k and splits), at 1 and 16 rows, 20
# copies of each matrix; the GPU tests of the split partials
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
PYTHONPATH=/tmp/site timeout 150 python -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/test_skinny_gemm.py \
  tests/test_static_drafters.py -k "gpu or 8b" > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)|Error" $R/gpu_tests.txt | head -5; tail -1 $R/gpu_tests.txt
timeout 400 python benchmarks/skinny_gemm.py --rows 1 16 --copies 20 --same-sums --shapes wqkv w13 lm_head \
  --out $R/same_sums.json > $R/same_sums.txt 2>&1; echo "sweep rc=$?"; grep -v skipped $R/same_sums.txt
