#!/bin/bash
# from the repository root, the venv active; EXPORT: the recipe's DFlash drafter (results/issue24_recipe_drafter_h200)
for i in 1 2 3; do
 for w in 0 1; do
  echo "run $i workers=$w"
  python benchmarks/batch_throughput.py --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT --questions 16 --max-new-tokens 128 --batch-sizes 8 --threads 2 --cpu-workers $w --only drafter 2>&1 | grep "^StaticDFlashDrafter (DFlash block of 16) |"
 done
done
# before: base16.txt
#   python benchmarks/batch_throughput.py --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT --questions 16 \
#     --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter
# bf16 drafter probe (not kept): python bf16_drafter_probe.py <the same arguments>  (the drafter loaded in bf16; batch 1 on
#   2 threads 119.6 tokens/s, batch 8 259.1, 2.17x; tau 3.250 / 3.247, 31 of 32 turns' counts equal to batch 1's)
