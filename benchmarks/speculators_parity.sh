#!/usr/bin/env bash
# Issue 25, item 4: our trainer against vLLM speculators' own trainer (0.9.0) on the same target, the same
# regenerated rows and the same number of samples, both drafters then evaluated by `python -m eval` with prompt
# lookup's tau on the same prompts beside them (docs/speculators_parity.md says how the settings map).
#
#   bash benchmarks/speculators_parity.sh TARGET PROMPTS HELDOUT OUT -- [overrides for both trainers]
#   e.g. bash benchmarks/speculators_parity.sh .target/qwen3-27m-sharegpt prompts.jsonl heldout.jsonl /tmp/parity -- \
#          data.max_records=2000 trainer.max_steps=1000
#
# Side by side: our runs (OURS, default "dflash:dflash;eagle3:eagle3": NAME:KIND[:more overrides] entries, each
# `python -m train experiment=KIND_swa_small ...`) and, per kind in PEER_KINDS (default "dflash eagle3"; empty: no
# peer run), the export of the same rows (`python -m train.data.speculators_export rows`), speculators'
# `prepare-data`, the hidden states of every prepared row, then `speculators train` with the command the export
# printed; then `python -m eval mtbench` and `python -m eval prompts HELDOUT` for each drafter. The overrides go to
# our runs and to the exports alike, so the export's epochs are our samples / our train rows.
# Environment: SPECULATORS (default "python -m speculators"), SPEC_TRAIN_EXTRA (flags appended to speculators
# train: --dry-run for a CPU smoke run; --loss-implementation eager where its fused Triton losses fail to compile,
# as on the H100 with torch 2.11), SPEC_TIME_LIMIT (seconds, default 1500), EVAL_TOKENS, EVAL_QUESTIONS (a smaller
# evaluation), SKIP_REGEN=1 (the regenerated data is cached already).
# Each phase's wall time goes to OUT/times.txt; OUT/DONE marks the end.
set -uo pipefail
target=$1 prompts=$2 heldout=$3 out=$4
shift 4
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
speculators=${SPECULATORS:-python -m speculators}
common=(logger=none target.path="$target" data.path="$prompts" trainer.progress=false "$@")
tokens=${EVAL_TOKENS:-256} questions=${EVAL_QUESTIONS:-}

source "$(dirname "${BASH_SOURCE[0]}")/small_target_lib.sh"
regenerate_once

ours() {  # name kind [overrides...]
  local name=$1 kind=$2
  shift 2
  stamp "ours $name: train start"
  python -m train experiment=${kind}_swa_small "${common[@]}" "$@" output_dir="$out/ours_$name" > "$out/train_ours_$name.log" 2>&1 \
    || stamp "ours $name: train failed"
  stamp "ours $name: train done"
  evaluate "ours_$name" "$out/ours_$name"
}

peer() {
  local kind=$1 spec="$out/spec_$kind" log="$out/spec_$kind.log"
  stamp "speculators $kind: export start"
  python -m train.data.speculators_export rows "$spec" experiment=${kind}_swa_small "${common[@]}" > "$log" 2>&1 \
    || { stamp "speculators $kind: rows failed"; return; }
  local prepare train
  prepare=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['commands']['prepare_data'])" "$spec/export.json")
  train=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['commands']['train'].replace('\\\\\n', ' '))" "$spec/export.json")
  eval "$speculators ${prepare#speculators }" >> "$log" 2>&1 || { stamp "speculators $kind: prepare-data failed"; return; }
  python -m train.data.speculators_export hidden-states "$spec" experiment=${kind}_swa_small "${common[@]}" >> "$log" 2>&1 \
    || { stamp "speculators $kind: hidden states failed"; return; }
  stamp "speculators $kind: train start ($(du -sh "$spec/prepared" | cut -f1) prepared)"
  eval "timeout ${SPEC_TIME_LIMIT:-1500} $speculators ${train#speculators } --logger '' ${SPEC_TRAIN_EXTRA:-}" > "$out/train_spec_$kind.log" 2>&1 \
    || stamp "speculators $kind: train exited $?"
  stamp "speculators $kind: train done"
  rm -rf "$spec/prepared/hidden_states"  # tens of GB; prepare-data's rows and the export stay
  evaluate "spec_$kind" "$spec/speculators_$kind"
}

IFS=';' read -r -a runs <<< "${OURS-dflash:dflash;eagle3:eagle3}"
for run in "${runs[@]}"; do
  IFS=':' read -r name kind extra <<< "$run"
  read -r -a extra <<< "$extra"
  ours "$name" "$kind" "${extra[@]}" &
done
for kind in ${PEER_KINDS-dflash eagle3}; do
  peer "$kind" &
done
wait
stamp "all done"
touch "$out/DONE"
