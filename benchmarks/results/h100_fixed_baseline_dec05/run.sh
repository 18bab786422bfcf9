#!/bin/bash
# H100: every drafter (bf16 and int8 drafter weights) at 8K then 1K against the fixed baseline, a process each
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > $R/gpu.txt; git log --oneline -1 > $R/tree.txt 2>/dev/null; cat $R/gpu.txt
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash dflash-vocab eagle3 --drafter-weights model int8"
for c in ${CTX:-8192 1024}; do
  timeout ${TMO:-280} python3 $CMD --contexts $c --out $R/all_${c}.json > $R/all_${c}.txt 2>&1; echo "$c rc=$?"
  grep -E "^static|^dflash|^eagle|forward" $R/all_${c}.txt | cut -c1-170
done
