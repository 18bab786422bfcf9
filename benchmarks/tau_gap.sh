#!/usr/bin/env bash
# The training metric against the decoding loop (BENCHMARKS.md "τ you can trust"): one DFlash run
# (experiment=dflash_swa on the reference target, 200 steps) with eval/loop_* at steps 100 and 200,
# then its export through `python -m eval mtbench` (first turns of held-out MT-Bench questions) with
# prompt lookup on the same prompts.
#
#   bash benchmarks/tau_gap.sh on|off TARGET DATA OUT [extra overrides...]
#     on  = data.regenerate.enabled=true (batch 256, 384 new tokens), off = the ShareGPT replies
set -euo pipefail
policy=$1 target=$2 data=$3 out=$4
shift 4
mkdir -p "$out"
regen=()
if [ "$policy" = on ]; then
  regen=(data.regenerate.enabled=true data.regenerate.batch_size=256 data.regenerate.max_new_tokens=384)
fi
run="$out/run_$policy"
python -m train experiment=dflash_swa logger=none target.path="$target" data.path="$data" "${regen[@]}" \
  trainer.max_steps=200 trainer.eval_every=100 trainer.checkpoint_every=0 trainer.progress=false \
  trainer.loop_eval_prompts=12 trainer.loop_eval_max_new_tokens=128 output_dir="$run" "$@" 2>&1 | grep -v "it/s\]" | tee "$out/train_$policy.log"
cp "$run/metrics.jsonl" "$out/metrics_$policy.jsonl"
python -m eval mtbench --target "$target" --drafter "$run/export" --num-questions "${NUM_QUESTIONS:-10}" --max-new-tokens 128 --device cuda \
  --no-baseline --out "$out/eval_$policy" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$out/eval_$policy.log"
cp "$out/eval_$policy/results.json" "$out/eval_results_$policy.json"
