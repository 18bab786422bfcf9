T=/work/shared/targets/qwen3-27m-sharegpt
D=/work/recipe_export
O=/work/bench_staged
for i in 1 2; do
for tree in before after; do
  dir=/work/main; [ $tree = before ] && dir=/tmp/before  # git worktree add /tmp/before 55f6f46 (the commit before the staged verify)
  cd $dir && /work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions 16 --max-new-tokens 128 \
    --batch-sizes 1 8 --threads 2 --only drafter > $O/${tree}16_$i.txt 2> $O/${tree}16_$i.err
  echo "$tree $i rc=$? $(date +%T)" >> $O/times.txt
done
done
