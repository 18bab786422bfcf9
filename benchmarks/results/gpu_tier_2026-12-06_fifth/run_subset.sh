#!/bin/bash
# the cuDNN band's probe under torch.compile on the GPU (EAGLE-3's compiled step), with the frontend installed
R=$OUT; export PYTHONUNBUFFERED=1
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || { cat /tmp/tgt_part_aa .gl/p2/tgt_part_ab .gl/p2/tgt_part_ac .gl/p2/tgt_part_ad > /tmp/tgt.tar.xz && python3 -c "import tarfile; tarfile.open('/tmp/tgt.tar.xz').extractall('/tmp/tgt')"; }
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=/tmp/tgt/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt; cat .gl/p2/tree.txt | tee $R/tree.txt
timeout 240 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu -o addopts="" -n 6 tests/test_window_attention.py tests/test_eagle3_train.py tests/test_gpt_oss_target.py > $R/subset.txt 2>&1; echo "rc=$?"
grep -E "passed|failed" $R/subset.txt | tail -1; grep -c "cudnn_band_problem\|installed_band_problem\|_cudnn_band_available" $R/subset.txt; grep -E "^(FAILED|ERROR)" $R/subset.txt | head
