#!/bin/bash
# call 6: every GPU-marked test (the README's GPU command) at this tree, cut at the call's limit
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
timeout 400 python -m pytest -q -rf -p no:cacheprovider -m gpu -o addopts="" -n 4 > $R/gpu_marker_tests.txt 2>&1
echo "rc=$?"; tail -8 $R/gpu_marker_tests.txt | cut -c1-250
