#!/bin/bash
# the tier's one failure alone (twice), then the gpt-oss GPU tests (heads of 16) and the window tests it took down with it
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || python3 -c "import tarfile; tarfile.open('.gl/tgt.tar.xz').extractall('/tmp/tgt')"
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=/tmp/tgt/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name --format=csv,noheader
for i in 1 2; do timeout 150 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -o addopts="" tests/test_batch.py -k captured_rows_reuse > $R/batch_$i.txt 2>&1; echo "batch run $i rc=$?"; tail -2 $R/batch_$i.txt; done
timeout 200 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu -o addopts="" -n 3 tests/test_gpt_oss_target.py tests/test_window_attention.py > $R/goss.txt 2>&1; echo "goss rc=$?"; grep -E "^(FAILED|ERROR)" $R/goss.txt | cut -c1-250; tail -1 $R/goss.txt
timeout 150 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu -o addopts="" tests/test_batch.py > $R/batch_all.txt 2>&1; echo "batch all rc=$?"; grep -E "^(FAILED|ERROR)" $R/batch_all.txt | cut -c1-250; tail -1 $R/batch_all.txt
