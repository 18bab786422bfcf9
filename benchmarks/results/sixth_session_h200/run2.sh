#!/bin/bash
# every drafter at 1K and 32K (tau 3 forced), a process each; the 8K row again
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
export PYTHONPATH=/tmp/site
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash dflash-vocab eagle3"
for c in 1024 32768; do
  timeout 180 python3 $CMD --contexts $c --out $R/all_${c}_b.json > $R/all_${c}_b.txt 2>&1; echo "$c rc=$?"
  grep -E "^static|^dflash|^eagle|forward" $R/all_${c}_b.txt | cut -c1-160
done
