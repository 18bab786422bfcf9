#!/bin/bash
# call 6: EAGLE-3 (chain, τ = 3 forced) at 1K and 8K with the final tree (o/down through the kernel)
R=$OUT; export PYTHONUNBUFFERED=1
timeout 190 python benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters eagle3 \
  --contexts 1024 8192 > $R/eagle3.txt 2>&1; echo "rc=$?"; grep -E "^static|forward at|^eagle" $R/eagle3.txt | cut -c1-150
# then, on the same warm machine, three more commands (the device's "run" tool, one each):
#   decode_speed.py ... --drafters eagle3 --contexts 8192            -> call6/eagle3_8k.txt
#   decode_speed.py ... --drafters eagle3 --contexts 32768           -> call6/eagle3_32k.txt
#   the tree with HEAD's skinny_gemm.py (/tmp/old), then this tree, --drafters eagle3 --contexts 32768
#                                                                    -> call6/eagle3_32k_old.txt, call6/eagle3_32k_new2.txt
