#!/bin/bash
# call 3 (run as .whl/run5.sh; benchmarks/results and models/builtin_weights moved aside so that the reference target
# fits the 64 MiB carry): three trees in one call, the DFlash loop at 8K: 8c994e7 (the session's start), 5013775 (the
# greedy verify in the target's graph, the drafter's greedy chain without fp32 logits) and the tree (also DFlash's
# q/k norms, RoPE and block keys inside the block attention kernel); then the GPU tests of what changed, with the
# reference target carried (.target) and hydra/omegaconf/antlr4 wheels (.whl)
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
for c in 8c994e7 5013775; do
  rm -rf /tmp/$c && mkdir /tmp/$c && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/$c/ 2>/dev/null
  for f in infer/generate.py models/dflash.py models/sampling.py models/static_target.py swa_kernels/block_attention.py; do
    git show $c:$f > /tmp/$c/$f; done
done
cp swa_kernels/argmax.py /tmp/5013775/swa_kernels/argmax.py
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
run() {  # name dir
  (cd $2 && timeout 100 python benchmarks/decode_speed.py $A > $R/$1.txt 2>&1); echo "$1 rc=$?"; grep -E "^static|forward at|^dflash" $R/$1.txt
}
run tree_1 .; run start_1 /tmp/8c994e7; run greedy_1 /tmp/5013775; run tree_2 .
export SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
PYTHONPATH=/tmp/site timeout 150 python -m pytest -q -p no:cacheprovider -o addopts="" -n 4 -rfE tests/test_argmax.py \
  tests/test_block_attention.py tests/test_static_drafters.py tests/test_static_target.py tests/test_infer_gpu.py \
  -k "gpu or cuda or 8b_widths or captured" > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head; tail -2 $R/gpu_tests.txt
