#!/bin/bash
# call 4: the grid order in the tree (pass1_grid) against HEAD's kernels: the DFlash loop at 8K alternately (HEAD's two
# kernel files, this tree), two pairs; GPU kernel tests; the block attention; the descriptor variants at 8K
R=$OUT; export PYTHONUNBUFFERED=1
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
git show HEAD:kernels/decode_attention.py > /tmp/old/kernels/decode_attention.py; git show HEAD:kernels/block_attention.py > /tmp/old/kernels/block_attention.py
git rev-parse HEAD > $R/commits.txt
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
for i in 1 2; do
  (cd /tmp/old && timeout 110 python benchmarks/decode_speed.py $A --out $R/old_$i.json > $R/old_$i.txt 2>&1); echo "old $i rc=$?"; grep -E "^static|forward at|^dflash" $R/old_$i.txt
  timeout 110 python benchmarks/decode_speed.py $A --out $R/new_$i.json > $R/new_$i.txt 2>&1; echo "new $i rc=$?"; grep -E "^static|forward at|^dflash" $R/new_$i.txt
done
timeout 100 python -m pytest -q -rA -p no:cacheprovider -o addopts="" tests/test_decode_attention.py tests/test_block_attention.py \
  -k "(gpu or cuda) and not static_target" 2>&1 | grep -E "PASS|FAIL|ERROR|passed|failed" | tail -12 > $R/gpu_tests.txt; echo "tests: $(tail -1 $R/gpu_tests.txt)"
(cd /tmp/old && timeout 45 python benchmarks/block_attention.py --anchors 8192 --keys-per-split > $R/block_old.txt 2>&1)
timeout 45 python benchmarks/block_attention.py --anchors 8192 --keys-per-split > $R/block_new.txt 2>&1
tail -4 $R/block_old.txt $R/block_new.txt
timeout 60 python benchmarks/verify_attention_variants.py --contexts 8192 --tokens 16 1 --merge-rows \
  --variants production splits_last tma_splits_last tma_2d_splits_last > $R/variants4.txt 2>&1; tail -8 $R/variants4.txt
