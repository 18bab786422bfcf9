#!/bin/bash
# call 6: this tree (9203032), the DFlash loop at 32K, 8K and 1K, one process each (texts appended to one log)
R=$OUT; mkdir -p $R
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0"
for c in 32768 8192 1024; do
  echo "=== $c" >> $R/log.txt; timeout 110 python benchmarks/decode_speed.py $A --contexts $c --out $R/new_$c.json >> $R/log.txt 2>&1; echo "$c rc=$?"
done
