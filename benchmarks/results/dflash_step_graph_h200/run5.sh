#!/bin/bash
# call 5: every GPU-marked test (the README's GPU command) at this tree, datasets' wheels carried this time (the image has
# pyarrow and pandas), cut at the call's limit
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
# datasets imports torchvision.io.VideoReader once torchvision is importable; the image's torchvision has none
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
python3 -c "import datasets, pyarrow, pandas; print('datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)" 2>&1 | tail -1
timeout 420 python -m pytest -q -rf -p no:cacheprovider -m gpu -o addopts="" -n 4 > $R/gpu_marker_tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)" $R/gpu_marker_tests.txt | cut -c1-220 | head -20; tail -3 $R/gpu_marker_tests.txt | cut -c1-250
