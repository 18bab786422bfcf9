# Shared by benchmarks/small_target_pipeline.sh and benchmarks/speculators_parity.sh (sourced, not run): the run folder's
# wall-time stamps, the one regeneration both drafter kinds share, and the MT-Bench + held-out evaluation with prompt
# lookup's tau beside. Expects: out, prompts, heldout, common (array of overrides), tokens, questions.

stamp() { echo "$(date +%H:%M:%S) $*" >> "$out/times.txt"; }

# A one-step run whose only lasting output is the cached regenerated data and tokenized dataset: the DFlash and EAGLE-3
# small recipes share the data settings, hence the cache key. SKIP_REGEN=1: the data is cached already.
regenerate_once() {
  [ -n "${SKIP_REGEN:-}" ] && return
  stamp "regenerate: start"
  python -m train experiment=dflash_swa_small "${common[@]}" trainer.max_steps=1 trainer.export=false trainer.eval_every=0 \
    trainer.loop_eval_prompts=0 trainer.checkpoint_every=0 output_dir="$out/regen_run" > "$out/regen.log" 2>&1
  stamp "regenerate: done ($(grep -o 'regenerated [0-9]* turns' "$out/regen.log" || echo 'from cache'))"
}

# evaluate NAME DRAFTER [EVAL ARGS...]: MT-Bench (80 questions x 2 turns) and the held-out prompts, greedy, batch 16 (BATCH),
# the drafter's recorded target (a run folder's, a speculators checkpoint's verifier), prompt lookup beside (eval's
# default, with as many drafts per step as the drafter)
evaluate() {
  evaluate_mtbench "$@"
  evaluate_heldout "$@"
}
evaluate_mtbench() {
  local name=$1 drafter=$2
  shift 2
  python -m eval mtbench --drafter "$drafter" --max-new-tokens "$tokens" --batch-size "${BATCH:-16}" --no-baseline "$@" \
    ${questions:+--num-questions $questions} --out "$out/mtbench_$name" > "$out/mtbench_$name.log" 2>&1 || stamp "$name: mtbench failed (see mtbench_$name.log)"
  stamp "$name: mtbench done"
}
evaluate_heldout() {
  local name=$1 drafter=$2
  shift 2
  python -m eval prompts --prompts "$heldout" --drafter "$drafter" --max-new-tokens "$tokens" --batch-size "${BATCH:-16}" \
    --no-baseline "$@" --out "$out/heldout_$name" > "$out/heldout_$name.log" 2>&1 || stamp "$name: heldout failed"
  stamp "$name: heldout done"
}
