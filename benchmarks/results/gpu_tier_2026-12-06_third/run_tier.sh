#!/bin/bash
# 2026-12-06: the library-internals checks on the image's torch/transformers, then the whole GPU tier at this session's code
# (the reference target travels as .gl/tgt.tar.xz: a call carries at most 64 MiB)
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || python3 -c "import tarfile; tarfile.open('.gl/tgt.tar.xz').extractall('/tmp/tgt')"
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=/tmp/tgt/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; cat $R/gpu.txt; cat .gl/tree.txt > $R/tree.txt 2>/dev/null
timeout 45 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -o addopts="" tests/test_library_internals.py > $R/internals.txt 2>&1; echo "internals rc=$?"; tail -3 $R/internals.txt
timeout ${TIER_S:-480} python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu -o addopts="" -n ${NPROC:-6} --durations=25 tests > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | cut -c1-250 | head -25; grep -E "passed|failed" $R/gpu_tests.txt | tail -2
