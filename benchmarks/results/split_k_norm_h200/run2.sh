#!/bin/bash
# call 2: o_proj/down_proj tilings at 1 and 16 rows (the one tiling a shape), the GPU tests of the change, then the loop
# at 8K: this tree (o/down through the kernel, splits added in the next norm) against HEAD's skinny_gemm.py (cuBLAS for
# o/down), interleaved, one process each
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
cp -r benchmarks/split_k_norm.py /tmp/old/benchmarks/ 2>/dev/null; cp .whl/skinny_gemm_head.py /tmp/old/swa_kernels/skinny_gemm.py
timeout 100 python benchmarks/split_k_norm.py --shapes wo --tiling 32,256,2 --tiling 32,128,2 > $R/tilings_wo.txt 2>&1; echo "wo rc=$?"
timeout 100 python benchmarks/split_k_norm.py --shapes w2 --tiling 64,128,4 --tiling 32,256,2 > $R/tilings_w2.txt 2>&1; echo "w2 rc=$?"
grep "^w" $R/tilings_wo.txt $R/tilings_w2.txt | cut -d: -f2 | cut -c1-90
export SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
PYTHONPATH=/tmp/site timeout 100 python -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/test_skinny_gemm.py \
  tests/test_static_target.py -k "gpu or captured or 8b" > $R/gpu_tests.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)|Error" $R/gpu_tests.txt | head -5; tail -1 $R/gpu_tests.txt
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
run() {  # name dir
  (cd $2 && timeout 105 python benchmarks/decode_speed.py $A > $R/$1.txt 2>&1); echo "$1 rc=$?"; grep -E "^static|forward at|^dflash" $R/$1.txt | cut -c1-150
}
run new_1 .; run old_1 /tmp/old; run new_2 .
