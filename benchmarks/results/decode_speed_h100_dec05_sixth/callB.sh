#!/bin/bash
# H100, sixth session: the drafters at 8K and 1K against the fixed baseline with the back-to-back forward timer (never run
# on a GPU before), and DFlash's whole block at 8K over its block pass's product and attention choices; a process each
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > $R/gpu.txt; cat $R/gpu.txt
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3"
run() { local name=$1 tmo=$2; shift 2
  timeout $tmo python3 $CMD "$@" --out $R/$name.json > $R/$name.txt 2>&1; echo "$name rc=$?"
  grep -E "^static|^dflash|^eagle|forward|bandwidth" $R/$name.txt | cut -c1-190; }
run all_8192 175 --drafters dflash dflash-vocab eagle3 --contexts 8192
run dflash_variants_8192 175 --drafters dflash --contexts 8192 --dflash-products cublas triton --dflash-attention products split_kv
[ "${WITH_1K:-0}" = 1 ] && run all_1024 140 --drafters dflash dflash-vocab eagle3 --contexts 1024
