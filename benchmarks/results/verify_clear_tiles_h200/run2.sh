#!/bin/bash
# Call 2: the split-KV kernel with the whole tiles before a row's first new position attended unmasked ("clear" tiles)
# against the kernel before (c273db1's kernels/decode_attention.py, shipped as before_decode_attention.py for the call):
# the split sweep at the rule's tilings in both trees, one after the other; the kernel's GPU tests in the new tree.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
rm -rf /tmp/before && mkdir /tmp/before && tar cf - --exclude=./benchmarks/results --exclude=./.git . | tar xf - -C /tmp/before
cp before_decode_attention.py /tmp/before/kernels/decode_attention.py
S="--contexts 8192 1024 32768 --tokens 1 16 --split-keys 128 256 512 1024 --tilings 64/4/2 64/4/3"
timeout 200 python benchmarks/attention_split_sizes.py $S > $OUT/sweep_after.txt 2>&1
(cd /tmp/before && timeout 200 python benchmarks/attention_split_sizes.py $S) > $OUT/sweep_before.txt 2>&1
timeout 120 python -m pytest -q -p no:cacheprovider -o addopts="" tests/test_decode_attention.py -k "on_the_gpu and not static" > $OUT/gpu_tests.txt 2>&1
tail -2 $OUT/gpu_tests.txt; paste -d'#' $OUT/sweep_before.txt $OUT/sweep_after.txt | sed 's/#/   ||   /'
