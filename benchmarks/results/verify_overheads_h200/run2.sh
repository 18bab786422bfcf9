#!/bin/bash
# call 2: the 1- and 16-token forwards' GPU idle gaps and timelines (1K, 8K)
R=$OUT; mkdir -p $R
for c in 1024 8192; do
  timeout 150 python benchmarks/profile_decode_loop.py --verify-split 16 --context $c > $R/verify_split_gaps_$c.txt 2>&1; echo "verify_split $c rc=$?"
done
