#!/usr/bin/env bash
# EAGLE-3 tree shapes on MT-Bench (80 questions x 2 turns) and a held-out prompt file, batched (static trees), greedy,
# 256 new tokens, prompt lookup beside (eval's default: as many drafts per step as the tree is deep); then the table
# (benchmarks/tree_table.py).
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
mkdir -p "$out"
for shape in $shapes; do
  IFS=: read -r k n d l p <<< "$shape"
  name=k${k}n${n}d${d}${l:+l$l}
  extra=()
  [ -n "$l" ] && extra+=(--tree-lookup "$l")
  [ "$p" = nopld ] && extra+=(--no-pld)
  for set in mtbench heldout; do
    [ -f "$out/${set}_$name/results.json" ] && continue  # done by an earlier run of the sweep
    if [ $set = mtbench ]; then what=(mtbench); else what=(prompts --prompts "$heldout"); fi
    start=$(date +%s)
    python -m eval "${what[@]}" --target "$target" --drafter "$drafter" --max-new-tokens 256 --batch-size "${BATCH:-16}" \
      --no-baseline --tree-topk "$k" --tree-tokens "$n" --draft-steps "$d" "${extra[@]}" --out "$out/${set}_$name" \
      > "$out/${set}_$name.log" 2>&1
    echo "$set $name: rc $? in $(( $(date +%s) - start )) s" >&2
  done
done
python benchmarks/tree_table.py "$out"/*_k*/
