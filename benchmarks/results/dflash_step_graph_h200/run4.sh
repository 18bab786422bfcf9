#!/bin/bash
# call 4: DFlash's block attention with the block's own keys in a split of their own: GPU tests of the kernel, the kernel
# at 1K/8K/32K (--raw, the drafter's call; the layout before timed beside it), then DFlash's whole block at 8K alternating
# this tree and the tree before (529eea0: swa_kernels/block_attention.py and decode_attention.py as they were)
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r $(ls -A | grep -vE '^(\.target|\.whl|\.git)$') /tmp/old/ && cp -r .whl/old/* /tmp/old/
timeout 120 python -m pytest -v -p no:cacheprovider -o addopts="" tests/test_block_attention.py > $R/tests.txt 2>&1
echo "tests rc=$?"; grep -E "FAILED|ERROR|passed|failed" $R/tests.txt | cut -c1-200 | tail -5
timeout 120 python benchmarks/block_attention.py --anchors 1024 8192 32768 --raw --keys-per-split > $R/block_attention_raw.txt 2>&1
echo "bench rc=$?"; cut -c1-260 $R/block_attention_raw.txt
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --contexts 8192"
for run in new1 old1 new2; do
  if [[ $run == old* ]]; then d=/tmp/old; else d=$PWD; fi
  (cd $d && timeout 100 python $CMD > $R/d8k_$run.txt 2>&1); echo "$run rc=$?"
  grep -E "^static|^dflash" $R/d8k_$run.txt | cut -c1-150
done
