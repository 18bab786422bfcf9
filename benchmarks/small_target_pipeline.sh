#!/usr/bin/env bash
# Issue 25's small recipes on one GPU in one go (the run folder names its target, which eval reads): regenerate the data once with the target, train the DFlash and the EAGLE-3
# small recipes side by side (both trainers are host-bound on a small target, so they share the GPU at little
# cost), then evaluate each export with prompt lookup's tau on the same prompts beside it:
#   MT-Bench (80 questions x 2 turns, 256 new tokens), the held-out ShareGPT prompts, and a long-prompt sweep
#   (prefill 0 and LONG filler tokens, the trained window and --window none).
#
#   bash benchmarks/small_target_pipeline.sh TARGET PROMPTS HELDOUT OUT LONG -- [overrides for both runs]
#   e.g. bash benchmarks/small_target_pipeline.sh builtin:smollm2-135m-instruct sharegpt_prompts.jsonl \
#          sharegpt_heldout_prompts.jsonl /tmp/res 8192 -- data.max_records=6000
#
# Per-drafter overrides: DFLASH_ARGS / EAGLE3_ARGS (environment, space-separated); EVAL_TOKENS, EVAL_QUESTIONS,
# SWEEP_QUESTIONS shrink the evaluation (a CPU smoke run); KINDS="dflash" trains one drafter only; EAGLE3_CHAINS="10 15"
# also evaluates EAGLE-3 at those chain lengths (--draft-steps; prompt lookup with as many drafts); EAGLE3_TREES="8:48:6"
# also evaluates EAGLE-3 with dynamic trees, TOPK:NODES:DEPTH[:LOOKUP] each (batch 1, both prompt sets at once while the
# chains run; LOOKUP: prompt lookup's chain joins each tree, --tree-lookup; prompt lookup beside drafts as deep as the
# deepest branch); DFLASH_TREES="32:1024:4" also evaluates DFlash with dynamic trees, TOPK:NODES[:REDRAFT[:LOOKUP]] each (batched
# like the block, both prompt sets, each tree beside the block's evaluation; REDRAFT: --tree-redraft, for a drafter trained
# with drafter.reveal_prob; LOOKUP: --tree-lookup, prompt lookup's chain as one more branch; prompt lookup beside is the
# block's, 15 drafts, as deep as the trees); SWEEP_TREE=1 sweeps the
# first of DFLASH_TREES too; SKIP_SWEEP=1 skips the long-prompt sweep; SKIP_EVAL=1 skips the MT-Bench and held-out
# evaluations of the trained window (the sweep's prefill-0 cells are MT-Bench's, prompt lookup beside). A run stopped by
# trainer.time_limit_minutes is finished at the step it reached (resumed with trainer.max_steps = that step) so
# that it exports. Each phase's wall time goes to OUT/times.txt; OUT/DONE marks the end.
set -uo pipefail
target=$1 prompts=$2 heldout=$3 out=$4 long=$5
shift 5
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"

common=(logger=none target.path="$target" data.path="$prompts" trainer.progress=false "$@")

source "$(dirname "${BASH_SOURCE[0]}")/small_target_lib.sh"
regenerate_once

train_and_eval() {
  local kind=$1; shift
  local run="$out/run_$kind" log="$out/train_$kind.log"
  stamp "$kind: train start"
  python -m train experiment=${kind}_swa_small "${common[@]}" "$@" output_dir="$run" > "$log" 2>&1
  if [ ! -f "$run/export/config.json" ]; then  # stopped by the time limit: finish at the step reached
    local step
    step=$(ls -d "$run"/checkpoints/step_* 2>/dev/null | sed 's/.*step_0*//' | sort -n | tail -1)
    stamp "$kind: no export after training (last checkpoint step ${step:-none}); finishing at that step"
    [ -n "$step" ] && python -m train experiment=${kind}_swa_small "${common[@]}" "$@" trainer.max_steps="$step" \
      output_dir="$run" >> "$log" 2>&1
  fi
  stamp "$kind: train done"
  if [ "$kind" = eagle3 ]; then  # trees decode one conversation at a time (host-bound): beside the batched chains, not after
    for t in ${EAGLE3_TREES:-}; do
      IFS=: read -r topk nodes depth lookup <<< "$t"
      for set in mtbench heldout; do
        evaluate_$set "eagle3_tree_k${topk}_n${nodes}_d${depth}${lookup:+_l$lookup}" "$run" --tree-topk "$topk" --tree-tokens "$nodes" \
          --draft-steps "$depth" --tree-lookup "${lookup:-0}" --batch-size 1 &
      done
    done
  fi
  if [ "$kind" = dflash ]; then  # no prompt lookup of their own: the block's evaluation below runs it on the same prompts
    for t in ${DFLASH_TREES:-}; do
      dflash_tree "$t"
      evaluate "$tree_name" "$run" "${tree_args[@]}" &
    done
  fi
  [ -z "${SKIP_EVAL:-}" ] && evaluate "$kind" "$run"
  if [ "$kind" = eagle3 ]; then
    for k in ${EAGLE3_CHAINS:-}; do evaluate "eagle3_k$k" "$run" --draft-steps "$k"; done
  fi
  wait
  [ -n "${SKIP_SWEEP:-}" ] && return
  sweep "$kind" "$run"
  if [ "$kind" = dflash ] && [ -n "${SWEEP_TREE:-}" ] && [ -n "${DFLASH_TREES:-}" ]; then
    dflash_tree "${DFLASH_TREES%% *}"
    sweep dflash_tree "$run" "${tree_args[@]}"
  fi
}

# dflash_tree TOPK:NODES[:REDRAFT[:LOOKUP]] -> tree_name and tree_args (eval's tree options, no prompt lookup of its own)
dflash_tree() {
  local topk nodes redraft lookup
  IFS=: read -r topk nodes redraft lookup <<< "$1"
  tree_name="dflash_tree_k${topk}_n${nodes}_r${redraft:-0}${lookup:+_l$lookup}"
  tree_args=(--no-pld --tree-topk "$topk" --tree-tokens "$nodes" --tree-redraft "${redraft:-0}" --tree-lookup "${lookup:-0}")
}

# sweep NAME DRAFTER [EVAL ARGS...]: the trained window and none, at prefill 0 and LONG
sweep() {
  local name=$1 drafter=$2
  shift 2
  python -m eval sweep --drafter "$drafter" --windows trained none --prefills 0 "$long" --num-questions "${SWEEP_QUESTIONS:-20}" \
    --max-new-tokens "$tokens" --batch-size 16 "$@" --out "$out/sweep_$name" > "$out/sweep_$name.log" 2>&1 || stamp "$name: sweep failed"
  stamp "$name: sweep done"
}

tokens=${EVAL_TOKENS:-256} questions=${EVAL_QUESTIONS:-}  # smaller for a CPU smoke run
read -r -a dflash_args <<< "${DFLASH_ARGS:-}"
read -r -a eagle3_args <<< "${EAGLE3_ARGS:-}"
for kind in ${KINDS:-dflash eagle3}; do
  if [ "$kind" = dflash ]; then train_and_eval dflash "${dflash_args[@]}" & else train_and_eval eagle3 "${eagle3_args[@]}" & fi
done
wait
stamp "all done"
touch "$out/DONE"
