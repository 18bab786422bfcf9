T=/work/shared/targets/qwen3-27m-sharegpt
D=/work/recipe_export
O=/work/bench_staged
cd /work/main && /work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions 80 --max-new-tokens 128 \
    --batch-sizes 1 8 --threads 2 --only drafter > $O/after80.txt 2> $O/after80.err
echo "after80 rc=$? $(date +%T)" >> $O/times.txt
