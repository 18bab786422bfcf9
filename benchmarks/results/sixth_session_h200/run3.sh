#!/bin/bash
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
timeout -s INT 320 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu -o addopts="" -n 4 --durations=10 > $R/gpu_tests_b.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed|Interrupt" $R/gpu_tests_b.txt | cut -c1-300 | head -30; ps aux | grep -c "pytest" 
