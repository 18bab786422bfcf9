# 2-core AMD EPYC (AVX-512), the recipe's DFlash drafter (benchmarks/results/issue24_recipe_drafter_h200), fp32 on the CPU
for w in model int8; do
  python -m eval mtbench --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT --batch-size 8 --max-new-tokens 256 \
    --no-baseline --drafter-weights $w --out mt_$w
done
# then: every turn's output_text equal between mt_model and mt_int8 (160 of 160); accepted_per_step equal on 89 of 160
# EAGLE-3: a drafter trained here for the check (17.2 min on this CPU; loop tau 1.92 against prompt lookup's 1.62 on its
# 8 held-out prompts), then the same two eval runs with it
python -m train experiment=eagle3_swa_tiny target.path=../shared/targets/qwen3-27m-sharegpt drafter.draft_vocab_size=8192 \
  trainer.max_steps=300 output_dir=E3RUN trainer.progress=false
for w in model int8; do
  python -m eval mtbench --target ../shared/targets/qwen3-27m-sharegpt --drafter E3RUN/export --batch-size 8 --max-new-tokens 256 \
    --no-baseline --drafter-weights $w --out e3_$w
done
# output_text equal on 160 of 160 turns; accepted_per_step equal on 132 of 160
