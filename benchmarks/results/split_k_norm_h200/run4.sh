#!/bin/bash
# call 4: the loop at 1K and 32K, this tree (o/down through the kernel, splits added in the next norm) against HEAD's
# skinny_gemm.py (cuBLAS for o/down), one process each
R=$OUT; export PYTHONUNBUFFERED=1
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
cp .whl/skinny_gemm_head.py /tmp/old/swa_kernels/skinny_gemm.py
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0"
run() {  # name dir context timeout
  (cd $2 && timeout $4 python benchmarks/decode_speed.py $A --contexts $3 > $R/$1.txt 2>&1); echo "$1 rc=$?"; grep -E "^static|forward at|^dflash" $R/$1.txt | cut -c1-150
}
run new_1k . 1024 115; run old_1k /tmp/old 1024 115; run new_32k . 32768 150; run old_32k /tmp/old 32768 150
