#!/bin/bash
# tried, not kept: shared_cores.patch applied on 3e0a30f (git apply), the repository root, the venv active;
# EXPORT: the recipe's DFlash drafter (results/issue24_recipe_drafter_h200). ab.txt: four alternating pairs.
for i in 1 2 3 4; do
 for o in "" "--fixed-worker-threads"; do
  echo "run $i $o"
  python benchmarks/batch_throughput.py --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT --questions 16 \
    --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter $o 2>/dev/null | grep "^Static"
 done
done
# first_try.txt: the patch's first version, --order workers-first against --order given (batch 1 first: the parent's pool
# started, the probe then waited 5 s before every worker pass, inside the timed pass; fixed since with a 2 s probe whose
# "no" is kept)
