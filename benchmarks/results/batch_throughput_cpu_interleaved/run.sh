#!/bin/bash
# the repository root, the venv active; EXPORT: the recipe's DFlash drafter (results/issue24_recipe_drafter_h200)
B="python benchmarks/batch_throughput.py --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --interleave"
$B --questions 16 --repeat 4 --only drafter pld > q16.txt
$B --questions 80 --repeat 2 --only drafter > q80.txt
$B --questions 80 --repeat 2 --only pld > q80_pld.txt
