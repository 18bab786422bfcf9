#!/usr/bin/env bash
# EAGLE-3 tree shapes on MT-Bench (80 questions x 2 turns) and a held-out prompt file, batched (static trees), greedy,
# 256 new tokens, prompt lookup beside (eval's default: as many drafts per step as the tree is deep); then the table
# (benchmarks/tree_table.py). The evaluations are small_target_lib.sh's (evaluate_mtbench / evaluate_heldout).
#
#   bash benchmarks/tree_sweep.sh TARGET DRAFTER HELDOUT.jsonl OUT "TOPK:NODES:DEPTH[:LOOKUP[:nopld]] ..."
#
# LOOKUP: prompt lookup's chain of that many drafts joins every tree (--tree-lookup). nopld: skip prompt lookup's own
# run (a shape whose depth another shape of the sweep shares: the table takes that one's). BATCH (16) rows in flight.
set -u
if [ $# -ne 5 ]; then
  echo "usage: bash benchmarks/tree_sweep.sh TARGET DRAFTER HELDOUT.jsonl OUT \"TOPK:NODES:DEPTH[:LOOKUP[:nopld]] ...\"" >&2
  exit 2
fi
target=$1 drafter=$2 heldout=$3 out=$4 shapes=$5
[ -f "$heldout" ] || { echo "error: held-out prompt file $heldout does not exist" >&2; exit 2; }
tokens=${TOKENS:-256} questions=${QUESTIONS:-}  # (smaller: a smoke run)
mkdir -p "$out"
source "$(dirname "$0")/small_target_lib.sh"
for shape in $shapes; do
  IFS=: read -r k n d l p <<< "$shape"
  name=k${k}n${n}d${d}${l:+l$l}
  args=(--target "$target" --tree-topk "$k" --tree-tokens "$n" --draft-steps "$d")
  [ -n "$l" ] && args+=(--tree-lookup "$l")
  [ "$p" = nopld ] && args+=(--no-pld)
  # done by an earlier run of the sweep: kept
  [ -f "$out/mtbench_$name/results.json" ] || evaluate_mtbench "$name" "$drafter" "${args[@]}"
  [ -f "$out/heldout_$name/results.json" ] || evaluate_heldout "$name" "$drafter" "${args[@]}"
done
cat "$out/times.txt" >&2
python benchmarks/tree_table.py "$out"/*_k*/
