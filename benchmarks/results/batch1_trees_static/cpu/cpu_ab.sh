#!/bin/bash
# CPU, batch-1 DFlash trees: before (ea78d5a, the eager drafter) and after (this tree, the static drafter on one row), alternating
. /work/venv/bin/activate
T="--target /work/shared/targets/qwen3-27m-sharegpt --drafter /work/recipe_export --tree-topk 8 --tree-tokens 64 --tree-lookup 15 --max-new-tokens 96 --device cpu"
for rep in 1 2; do
  for code in before after; do
    dir=/work/main; [ $code = before ] && dir=/work/before_wt
    for cell in "0 6" "8000 2"; do
      set -- $cell
      out=/work/scratch/tree1/${code}_p$1_$rep
      s=$(date +%s.%N); (cd $dir && python -m eval mtbench $T --prefill-tokens $1 --num-questions $2 --out $out > $out.txt 2>&1); e=$(date +%s.%N)
      echo "$code prefill $1 rep $rep: $(python3 -c "print(round($e - $s, 1))") s"; grep -A2 "^| turns" $out/summary.md | tail -1
    done
  done
done
