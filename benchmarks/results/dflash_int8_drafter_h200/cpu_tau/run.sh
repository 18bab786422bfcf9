# 2-core AMD EPYC (AVX-512), the recipe's DFlash drafter (benchmarks/results/issue24_recipe_drafter_h200), fp32 on the CPU
for w in model int8; do
  python -m eval mtbench --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT --batch-size 8 --max-new-tokens 256 \
    --no-baseline --drafter-weights $w --out mt_$w
done
# then: every turn's output_text equal between mt_model and mt_int8 (160 of 160); accepted_per_step equal on 89 of 160
