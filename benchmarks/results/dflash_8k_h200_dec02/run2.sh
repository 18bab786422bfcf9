#!/bin/bash
# call 3: where the DFlash step's time goes at 8K (the loop at τ = 3 forced, profiled; the block pass and the append
# alone against their floors)
R=$OUT; mkdir -p $R
timeout 200 python benchmarks/profile_decode_loop.py --context 8192 --drafter dflash --tau 3 > $R/loop8k.txt 2>&1; echo "loop rc=$?"
timeout 200 python benchmarks/profile_decode_loop.py --context 8192 --dflash-block > $R/block8k.txt 2>&1; echo "block rc=$?"
grep -A14 "largest GPU idle" $R/loop8k.txt | head -16; grep "τ\|floors\|captured" $R/*.txt | head
