#!/bin/bash
# call 5: this tree (pass1_grid) alone, more processes: the DFlash loop at 8K three times, then 1K and 32K once each
R=$OUT; export PYTHONUNBUFFERED=1
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0"
for c in 8192 8192 8192 1024 32768; do
  i=$((i+1)); timeout 115 python benchmarks/decode_speed.py $A --contexts $c --out $R/p${i}_$c.json > $R/p${i}_$c.txt 2>&1
  echo "process $i context $c rc=$?"; grep -E "^static|forward at|^dflash" $R/p${i}_$c.txt
done
