#!/bin/bash
# 2026-12-06 (fourth session), after setup.sh 1-3 (FA4 4.0.0b36 installed): FA4's recorded internals checked live on the GPU
# (the BlockInfo/AttentionMask methods added to RECORDED), the FA4 GPU tests, then the rest of the GPU tier.
set -u
R=$OUT; export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages SWA_REFERENCE_TARGET=/tmp/tgt
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; cat .dev/tree.txt > $R/tree.txt
python3 -c "from swa_kernels import fa4_adapter as a; print('fa4', a.installed_version(), a.check())" > $R/fa4_check.txt 2>&1; cat $R/fa4_check.txt | tail -3
timeout 60 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -o addopts="" tests/test_library_internals.py tests/test_fa4_adapter.py tests/test_internals_checks.py > $R/internals.txt 2>&1; echo "internals rc=$?"; tail -2 $R/internals.txt
F4="tests/test_key_intervals_gpu.py tests/test_gpu.py tests/test_window_attention.py"
timeout ${FA4_S:-260} python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu -o addopts="" -n 6 --durations=15 $F4 > $R/fa4_tests.txt 2>&1; echo "fa4 tests rc=$?"
grep -E "^(FAILED|ERROR)" $R/fa4_tests.txt | cut -c1-250 | head; grep -E "passed|failed" $R/fa4_tests.txt | tail -1
IGN=$(for f in $F4; do printf -- "--ignore=%s " $f; done)
timeout ${REST_S:-250} python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu -o addopts="" -n 6 --durations=15 $IGN tests > $R/rest_tests.txt 2>&1; echo "rest rc=$?"
grep -E "^(FAILED|ERROR)" $R/rest_tests.txt | cut -c1-250 | head; grep -E "passed|failed" $R/rest_tests.txt | tail -1
