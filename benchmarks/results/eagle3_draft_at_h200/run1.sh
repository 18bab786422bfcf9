#!/bin/bash
# call 1: EAGLE-3 (chain of 3, tau = 3 forced) at 32K with draft_at (this tree) against b7492f3's eagle3.py (no draft_at),
# alternating new/old/new/old, then new at 1K and 8K
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
rm -rf /tmp/old && mkdir -p /tmp/old && git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/old/ 2>/dev/null
cp .whl/eagle3_old.py /tmp/old/models/eagle3.py
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv | tail -1
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters eagle3"
for i in 1 2; do
  (timeout 130 python $CMD --contexts 32768 > $R/e3_32k_new$i.txt 2>&1; echo "new$i rc=$?")
  grep -E "^static|^eagle" $R/e3_32k_new$i.txt | cut -c1-160
  (cd /tmp/old && timeout 130 python $CMD --contexts 32768 > $R/e3_32k_old$i.txt 2>&1; echo "old$i rc=$?")
  grep -E "^static|^eagle" $R/e3_32k_old$i.txt | cut -c1-160
done
timeout 150 python $CMD --contexts 1024 8192 > $R/e3_1k_8k_new.txt 2>&1; echo "1k8k rc=$?"
grep -E "^static|^eagle" $R/e3_1k_8k_new.txt | cut -c1-160
