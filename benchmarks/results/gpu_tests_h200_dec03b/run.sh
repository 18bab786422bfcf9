#!/bin/bash
# call 2 of 2: every GPU test at HEAD with the reference target carried (.target); the wheels from install.sh in
# /tmp/site (the machine kept warm between the calls); FA4, FlashInfer, vLLM, speculators not installed
set -u
test -d /tmp/site/hydra || { echo "run install.sh first"; exit 3; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
timeout 570 python3 -m pytest -m gpu -o addopts="" -n 4 -p no:cacheprovider -q -rfEs --durations 25 tests 2>&1 | grep -v DEBUG > $OUT/gpu_tests.txt
echo "rc=${PIPESTATUS[0]}"; grep -E "^(FAILED|ERROR) " $OUT/gpu_tests.txt | head -20; tail -3 $OUT/gpu_tests.txt
