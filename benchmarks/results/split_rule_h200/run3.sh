#!/bin/bash
# Call 3: the 8B-shape loop at 8K, this tree (DFlash's block attention back on its own split rule) and the tree before
# (c273db1's kernels/decode_attention.py), alternately, two processes each.
source benchmarks/results/split_rule_h200/common.sh
for i in 1 2; do  # ~75 s a process
  timeout 100 python benchmarks/decode_speed.py $A --contexts 8192 --out $R/after_8k_$i.json > $R/after_8k_$i.txt 2>&1; echo "after rc=$?"
  (cd /tmp/before && timeout 100 python benchmarks/decode_speed.py $A --contexts 8192 --out $R/before_8k_$i.json) > $R/before_8k_$i.txt 2>&1; echo "before rc=$?"
done
summarize
