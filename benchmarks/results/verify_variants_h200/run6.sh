#!/bin/bash
# call 6: DFlash's block attention with the one-wave split rule at one program an SM (equal_splits) against HEAD's
# (ceil): the DFlash loop at 8K (HEAD, tree, tree), then the block attention's variants at 1K / 8K / 32K
R=$OUT; export PYTHONUNBUFFERED=1
rm -rf /tmp/old && mkdir /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
for f in kernels/decode_attention.py kernels/block_attention.py; do git show HEAD:$f > /tmp/old/$f; done
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
(cd /tmp/old && timeout 105 python benchmarks/decode_speed.py $A > $R/old_1.txt 2>&1); echo "old rc=$?"; grep -E "^static|forward at|^dflash" $R/old_1.txt
for i in 1 2; do
  timeout 105 python benchmarks/decode_speed.py $A > $R/new_$i.txt 2>&1; echo "new $i rc=$?"; grep -E "^static|forward at|^dflash" $R/new_$i.txt
done
timeout 70 python benchmarks/block_attention.py --anchors 8192 1024 32768 --keys-per-split 128 192 512 576 1024 > $R/block.txt 2>&1; echo "block rc=$?"; grep anchor $R/block.txt
