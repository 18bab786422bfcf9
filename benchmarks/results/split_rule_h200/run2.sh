#!/bin/bash
# Call 2: the split rule after call 1's sweep (one token: the four-per-SM split to the nearest tile; a verify's 64 rows
# on Hopper: two programs per SM once a split holds 3+ tiles) against the rule of c273db1 (before_decode_attention.py,
# shipped for the call): the sweep marks the new choices; DFlash's block attention at its default split; the kernel's
# GPU tests; the 8B-shape loop at 8K, this tree then the tree before, one process each.
source benchmarks/results/split_rule_h200/common.sh
timeout 150 python benchmarks/attention_split_sizes.py --contexts 4096 8192 16384 --tokens 1 16 --split-keys 64 128 256 512 \
    --tilings 64/4/2 64/4/3 > $R/sweep_rule.txt 2>&1
timeout 100 python benchmarks/block_attention.py --anchors 1024 8192 32768 --keys-per-split 256 512 > $R/block_after.txt 2>&1
(cd /tmp/before && timeout 100 python benchmarks/block_attention.py --anchors 1024 8192 32768 --keys-per-split 256 512) > $R/block_before.txt 2>&1
timeout 120 python -m pytest -q -p no:cacheprovider -o addopts="" tests/test_decode_attention.py tests/test_block_attention.py \
    -k "gpu or cuda or tiling" --deselect tests/test_decode_attention.py::test_static_target_split_kv_on_the_gpu > $R/gpu_tests.txt 2>&1
timeout 110 python benchmarks/decode_speed.py $A --contexts 8192 --out $R/after_8k_1.json > $R/after_8k_1.txt 2>&1; echo "after rc=$?"
(cd /tmp/before && timeout 110 python benchmarks/decode_speed.py $A --contexts 8192 --out $R/before_8k_1.json) > $R/before_8k_1.txt 2>&1; echo "before rc=$?"
tail -3 $R/gpu_tests.txt; cat $R/sweep_rule.txt; grep -v "^#" $R/block_after.txt | head -20; grep -v "^#" $R/block_before.txt | head -20
summarize
