#!/bin/bash
# call 3: the tree (greedy_step's acceptance in two kernels, swa_kernels/argmax.greedy_values; the target's embedding
# rows gathered) against HEAD 8c994e7, alternated, the DFlash loop at 8K; then the GPU tests of the new kernels and the
# drafters (hydra/omegaconf/antlr4 wheels carried in .whl for test_static_drafters' imports)
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
for f in infer/generate.py models/dflash.py models/sampling.py models/static_target.py; do git show HEAD:$f > /tmp/old/$f; done
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
for i in 1 2; do
  timeout 110 python benchmarks/decode_speed.py $A > $R/new_$i.txt 2>&1; echo "new $i rc=$?"; grep -E "^static|forward at|^dflash" $R/new_$i.txt
  (cd /tmp/old && timeout 110 python benchmarks/decode_speed.py $A > $R/old_$i.txt 2>&1); echo "old $i rc=$?"; grep -E "^static|forward at|^dflash" $R/old_$i.txt
done
PYTHONPATH=/tmp/site timeout 140 python -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/test_argmax.py tests/test_static_drafters.py \
  -k "gpu or cuda or 8b_widths" > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"; tail -3 $R/gpu_tests.txt
