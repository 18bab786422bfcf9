#!/bin/bash
# call 3: one DFlash step at 8K event by event (this tree), then every drafter at 1K, 8K (twice) and 32K, a process each
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
timeout 150 python benchmarks/profile_decode_loop.py --context 8192 --drafter dflash --tau 3 --tokens 96 \
  --step-timeline $R/step8k.txt > $R/prof8k.txt 2>&1; echo "prof rc=$?"; head -1 $R/step8k.txt
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash dflash-vocab eagle3"
for c in 8192 1024 32768; do
  timeout 130 python $CMD --contexts $c > $R/all_$c.txt 2>&1; echo "$c rc=$?"
  grep -E "^static|^dflash|^eagle" $R/all_$c.txt | cut -c1-150
done
