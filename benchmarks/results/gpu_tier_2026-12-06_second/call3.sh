#!/bin/bash
# the eagle3 capture flake: a fresh Triton cache each run, Triton compiles and loads during a capture logged
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || python3 -c "import tarfile; tarfile.open('.gl/tgt.tar.xz').extractall('/tmp/tgt')"
export PYTHONPATH=/tmp/site:$PWD/.gl SWA_REFERENCE_TARGET=/tmp/tgt/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name --format=csv,noheader; python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
for i in 1 2 3; do export TRITON_CACHE_DIR=$(mktemp -d); echo "== run $i" >> $R/capture_probe.txt
  timeout 150 python3 -m pytest -q -rfEs --tb=line -p no:cacheprovider -p capture_probe -o addopts="" tests/test_batch.py -k "captured_rows_reuse and eagle3" > $R/run_$i.txt 2>&1; echo "run $i rc=$?"; tail -1 $R/run_$i.txt; done
grep -B1 -A9 "capturing=True" $R/capture_probe.txt | head -60
