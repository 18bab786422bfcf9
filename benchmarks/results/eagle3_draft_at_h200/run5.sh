#!/bin/bash
# call 5: the loop's run-ahead tests on the GPU: EAGLE-3's draft_at (captured) and DFlash's, against the target's own output
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
timeout 280 python -m pytest -v -p no:cacheprovider -o addopts="" -n 2 tests/test_static_eagle3.py tests/test_static_drafters.py \
  -k "ahead_of_the_host_sync or end_where_the_target_alone_ends" > $R/run_ahead_tests.txt 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" $R/run_ahead_tests.txt | cut -c1-200 | tail -12
