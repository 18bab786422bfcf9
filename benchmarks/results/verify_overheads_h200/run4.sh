#!/bin/bash
# call 4: the kernel over live tiles only; GPU tests; the 1- and 16-token forwards kernel by kernel at 8K; the loop at 8K,
# the tree before (43131bc's files) and this tree alternately
R=$OUT; mkdir -p $R; D=benchmarks/results/verify_overheads_h200
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
# the tree before: 43131bc's two files (ran as copies kept in $D/old/, since dropped for git history)
git show 43131bc:kernels/decode_attention.py > /tmp/old/kernels/decode_attention.py; git show 43131bc:models/static_target.py > /tmp/old/models/static_target.py
timeout 100 python -m pytest -q -rA -p no:cacheprovider -o addopts="" tests/test_decode_attention.py tests/test_static_target.py -k "gpu or cuda or 8b_widths" 2>&1 | grep -v DEBUG | tail -14 > $R/gpu_tests.txt; echo "tests done"
timeout 80 python benchmarks/profile_decode_loop.py --verify-split 16 --context 8192 > $R/verify_split_8192.txt 2>&1; echo "split rc=$?"
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
for i in 1 2; do
  (cd /tmp/old && timeout 100 python benchmarks/decode_speed.py $A --out $R/old_$i.json > $R/old_$i.txt 2>&1); echo "old $i rc=$?"
  timeout 100 python benchmarks/decode_speed.py $A --out $R/new_$i.json > $R/new_$i.txt 2>&1; echo "new $i rc=$?"
done
