#!/bin/bash
# call 2: the greedy verify in the target's graph (StaticTarget.greedy_step), the drafter's greedy block without fp32
# logits (block_greedy), row_argmax: HEAD (8c994e7) against the tree, alternated, the DFlash loop at 8K; then the
# tree's step timeline at 8K and the GPU tests of the new kernel and the drafters
R=$OUT; export PYTHONUNBUFFERED=1
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
for f in infer/generate.py models/dflash.py models/sampling.py models/static_target.py; do git show HEAD:$f > /tmp/old/$f; done
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
for i in 1 2; do
  (cd /tmp/old && timeout 110 python benchmarks/decode_speed.py $A > $R/old_$i.txt 2>&1); echo "old $i rc=$?"; grep -E "^static|forward at|^dflash" $R/old_$i.txt
  timeout 110 python benchmarks/decode_speed.py $A > $R/new_$i.txt 2>&1; echo "new $i rc=$?"; grep -E "^static|forward at|^dflash" $R/new_$i.txt
done
timeout 100 python benchmarks/profile_decode_loop.py --context 8192 --drafter dflash --tau 3 --tokens 96 \
  --step-timeline $R/step8k_new.txt > $R/prof8k_new.txt 2>&1; echo "prof rc=$?"; grep -A14 "one step" $R/prof8k_new.txt; grep "dflash τ" $R/prof8k_new.txt
timeout 120 python -m pytest -q -p no:cacheprovider -o addopts="" tests/test_row_argmax.py tests/test_static_drafters.py \
  -k "gpu or cuda or 8b_widths" > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"; tail -3 $R/gpu_tests.txt
