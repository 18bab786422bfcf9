#!/bin/bash
# this session's target checks on a GPU: the gpt-oss, static-target and batch GPU tests at this code
export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || python3 -c "import tarfile; tarfile.open('.gl/tgt.tar.xz').extractall('/tmp/tgt')"
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=/tmp/tgt/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name --format=csv,noheader; cat .gl/tree.txt
timeout ${T:-170} python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu -o addopts="" -n 6 tests/test_gpt_oss_target.py tests/test_static_target.py tests/test_batch.py > $OUT/gpu_subset.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)" $OUT/gpu_subset.txt | cut -c1-200 | head; tail -1 $OUT/gpu_subset.txt
