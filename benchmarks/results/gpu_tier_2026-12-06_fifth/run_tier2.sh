#!/bin/bash
# call 2 of 2: the reference target whole, the library-internals checks, then the whole GPU tier (with cuDNN's frontend installed)
R=$OUT; export PYTHONUNBUFFERED=1
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || { cat /tmp/tgt_part_aa .gl/p2/tgt_part_ab .gl/p2/tgt_part_ac .gl/p2/tgt_part_ad > /tmp/tgt.tar.xz && python3 -c "import tarfile; tarfile.open('/tmp/tgt.tar.xz').extractall('/tmp/tgt')"; }
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=/tmp/tgt/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; cat $R/gpu.txt; cat .gl/p2/tree.txt > $R/tree.txt
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" | tee $R/cudnn.txt
python3 -c "
import logging; logging.basicConfig()
from swa_kernels.window_attention import cudnn_band_available, cudnn_band_problem
print('cudnn band available:', cudnn_band_available(), 'problem:', cudnn_band_problem())" 2>&1 | tee -a $R/cudnn.txt
timeout 45 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -o addopts="" tests/test_library_internals.py > $R/internals.txt 2>&1; echo "internals rc=$?"; tail -3 $R/internals.txt
timeout ${TIER_S:-450} python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu -o addopts="" -n ${NPROC:-6} --durations=25 tests > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | cut -c1-250 | head -25; grep -E "passed|failed" $R/gpu_tests.txt | tail -2
grep -E "window_attention.*cudnn|band" $R/gpu_tests.txt | head -5
