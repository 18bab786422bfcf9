# prompt lookup alone with 24 and 32 drafts a step on the same prompts (the fourth call, on the same warm machine)
export PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache PYTHONUNBUFFERED=1; W=/tmp/e3; T=/tmp/tgt/qwen3-27m-sharegpt
for k in 24 32; do
  python3 -m eval mtbench --target $T --drafter pld --draft-steps $k --max-new-tokens 256 --batch-size 16 --no-baseline --out $W/mtbench_pld$k &
  python3 -m eval prompts --prompts /tmp/pf/sharegpt_heldout_prompts.jsonl --target $T --drafter pld --draft-steps $k --max-new-tokens 256 --batch-size 16 --no-baseline --out $W/heldout_pld$k &
done; wait
