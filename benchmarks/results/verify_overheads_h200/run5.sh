#!/bin/bash
# call 5: the loop at 1K and 32K, the tree before (43131bc's files) and this tree alternately (texts appended to one log)
R=$OUT; mkdir -p $R; D=benchmarks/results/verify_overheads_h200
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
# the tree before: 43131bc's two files (ran as copies kept in $D/old/, since dropped for git history)
git show 43131bc:kernels/decode_attention.py > /tmp/old/kernels/decode_attention.py; git show 43131bc:models/static_target.py > /tmp/old/models/static_target.py
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 1024 32768"
for i in 1 2; do
  echo "=== old $i" >> $R/log.txt; (cd /tmp/old && timeout 120 python benchmarks/decode_speed.py $A --out $R/old_$i.json >> $R/log.txt 2>&1); echo "old $i rc=$?"
  echo "=== new $i" >> $R/log.txt; timeout 120 python benchmarks/decode_speed.py $A --out $R/new_$i.json >> $R/log.txt 2>&1; echo "new $i rc=$?"
done
