#!/bin/bash
# call 1 (tree fe486c3: the verify attention's live tiles, new keys in the lightest split, o_proj's layout): every GPU test
# of the decode loop with the reference target carried (benchmarks/results and the tiny Qwen3 weights moved aside for
# the 64 MiB carry): the split-KV kernel, the static target against HF, the captured drafters, batched rows, and the
# greedy loop lossless behind long prefills
R=$OUT; mkdir -p $R
# hydra/omegaconf for train.config imports (carried wheels; the image has none)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; git log -1 --format=%H >> $R/gpu.txt
SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt timeout 560 python -m pytest -q -rA -p no:cacheprovider -o addopts="" \
  tests/test_decode_attention.py tests/test_static_target.py tests/test_infer_gpu.py tests/test_batch.py \
  tests/test_static_drafters.py tests/test_block_attention.py tests/test_static_eagle3.py tests/test_static_eagle3_trees.py \
  tests/test_dflash_trees.py tests/test_skinny_gemm.py tests/test_int8_weights.py \
  -k "gpu or cuda or captured or 8b_widths" --durations 15 2>&1 | grep -v DEBUG | tail -80 > $R/gpu_tests.txt
echo "rc=${PIPESTATUS[0]}"; tail -3 $R/gpu_tests.txt
