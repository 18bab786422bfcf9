#!/bin/bash
# call 3 (run as .whl/run4.sh; benchmarks/results and models/builtin_weights moved aside to fit the reference target in
# the 64 MiB carry): the tree (greedy_step's acceptance in two kernels, swa_kernels/argmax.greedy_values; the target's
# embedding rows gathered) against HEAD 8c994e7, the DFlash loop at 8K (new, old, new); then the GPU tests of the new
# kernels, the captured target and drafters, and the greedy loop's losslessness on the GPU with the reference target
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
for f in infer/generate.py models/dflash.py models/sampling.py models/static_target.py; do git show HEAD:$f > /tmp/old/$f; done
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
timeout 110 python benchmarks/decode_speed.py $A > $R/new_1.txt 2>&1; echo "new 1 rc=$?"; grep -E "^static|forward at|^dflash" $R/new_1.txt
(cd /tmp/old && timeout 110 python benchmarks/decode_speed.py $A > $R/old_1.txt 2>&1); echo "old 1 rc=$?"; grep -E "^static|forward at|^dflash" $R/old_1.txt
timeout 110 python benchmarks/decode_speed.py $A > $R/new_2.txt 2>&1; echo "new 2 rc=$?"; grep -E "^static|forward at|^dflash" $R/new_2.txt
export SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
PYTHONPATH=/tmp/site timeout 200 python -m pytest -q -p no:cacheprovider -o addopts="" -n 4 -rfE tests/test_argmax.py \
  tests/test_static_drafters.py tests/test_static_target.py tests/test_infer_gpu.py -k "gpu or cuda or 8b_widths or captured" \
  > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head; tail -2 $R/gpu_tests.txt
