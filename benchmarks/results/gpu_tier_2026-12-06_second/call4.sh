#!/bin/bash
# the capture fix: the new GPU test at the fix and at the code before it; the tier's flaky test, all four kinds, fresh Triton caches
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || python3 -c "import tarfile; tarfile.open('.gl/tgt.tar.xz').extractall('/tmp/tgt')"
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=/tmp/tgt/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name --format=csv,noheader
P="python3 -m pytest -q -rfEs --tb=line -p no:cacheprovider -o addopts="
timeout 100 $P tests/test_static_target.py -k collection > $R/fix.txt 2>&1; echo "fix rc=$?"; tail -1 $R/fix.txt
cp models/static_target.py /tmp/new.py; cp .gl/static_target_old.py models/static_target.py
timeout 100 $P tests/test_static_target.py -k collection > $R/before.txt 2>&1; echo "before rc=$?"; grep -E "^E |Error" $R/before.txt | head -3; tail -1 $R/before.txt
cp /tmp/new.py models/static_target.py
for i in 1 2; do export TRITON_CACHE_DIR=$(mktemp -d); timeout 130 $P tests/test_batch.py -k captured_rows_reuse > $R/batch_$i.txt 2>&1; echo "batch $i rc=$?"; tail -1 $R/batch_$i.txt; done
