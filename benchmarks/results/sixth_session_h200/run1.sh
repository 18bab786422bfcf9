#!/bin/bash
# the GPU tier at this tree, then every drafter at 8K (tau 3 forced), one process
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; git log --oneline -1 > $R/tree.txt 2>/dev/null
timeout 370 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu -o addopts="" -n 4 --durations=15 --junitxml=$R/gpu.xml > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | cut -c1-300 | head -30; tail -3 $R/gpu_tests.txt | cut -c1-250
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash dflash-vocab eagle3"
timeout 170 python3 $CMD --contexts 8192 --out $R/all_8192.json > $R/all_8192.txt 2>&1; echo "8192 rc=$?"
grep -E "^static|^dflash|^eagle|forward" $R/all_8192.txt | cut -c1-160
