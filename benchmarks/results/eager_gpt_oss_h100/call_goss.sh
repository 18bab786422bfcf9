#!/bin/bash
# gpt-oss-20b's shape, random bf16 weights, on the eager CachedTarget: AR and forced-τ DFlash at 1K and 8K
export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader; git log -1 --format=%h 2>/dev/null; cat .gl/tree.txt
timeout ${T:-300} python3 benchmarks/eager_target_speed.py --shape gpt-oss-20b --contexts 1024 8192 --new-tokens 48 --taus 3 --out $OUT/eager_gpt_oss.json 2>&1 | grep -v Warning | tee $OUT/eager_gpt_oss.txt
