#!/bin/bash
# every GPU test at HEAD with the reference target carried (.target); FA4, FlashInfer, vLLM, speculators not installed
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; git log -1 --format=%H >> $OUT/gpu.txt 2>/dev/null
timeout 570 python3 -m pytest -m gpu -o addopts="" -n 4 -p no:cacheprovider -q -rfEs --durations 25 tests 2>&1 | grep -v DEBUG > $OUT/gpu_tests.txt
echo "rc=${PIPESTATUS[0]}"; grep -E "^(FAILED|ERROR) " $OUT/gpu_tests.txt | head -20; tail -3 $OUT/gpu_tests.txt
