#!/bin/bash
# call A (carries .dev/g): scripts and data to /tmp, then the FA4 GPU tests not reached last session + test_gpu.py whole
set -u
mkdir -p /tmp/g && cp .dev/g/* /tmp/g/ && cp .dev/g/sg_train_600.jsonl /tmp/sg_train_600.jsonl
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/res1; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/res1.tgz -C $R .' EXIT
cp .dev/g/tree.txt $R/; ls /tmp/tgt > $R/tgt.txt
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
python3 -c "from kernels import fa4_adapter as a; print(a.installed_version(), a.check(), a.available())" > $R/fa4_check.txt 2>&1
date +%T > $R/times.txt
timeout 420 python3 -m pytest -q -o addopts="" -p no:cacheprovider --durations=20 -rfE tests/test_gpu.py tests/test_key_intervals_gpu.py \
  tests/test_window_attention.py -k "gpu or one_graph or fused_diagonal or fa4" > $R/gpu_tests.txt 2>&1
echo "tests rc=$? $(date +%T)" >> $R/times.txt
tail -30 $R/gpu_tests.txt
