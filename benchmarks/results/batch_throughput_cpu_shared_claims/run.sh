# CPU workers claiming conversations from a shared counter (eval/runner.py decode_in_workers) against the round-robin
# split before it (/work/before_claims: the tree at c2c50c9), alternately, nothing else running.
R=/work/main/benchmarks/results/batch_throughput_cpu_shared_claims; mkdir -p $R
T=/work/shared/targets/qwen3-27m-sharegpt; D=/work/recipe_export
run() { # name dir questions extra
  (cd $2 && /work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions $3 --max-new-tokens 128 --batch-sizes ${BS:-1 8} --threads 2 --only drafter $4 --out $R/$1.json > $R/$1.txt 2> $R/$1.err)
  echo "$1 rc=$? $(date +%T)" >> $R/times.txt
}
lscpu > $R/lscpu.txt
run now_whole16 /work/main 16 ""
BS=8 run before_whole16 /work/before_claims 16 ""
run now_k3_16 /work/main 16 "--draft-steps 3"
BS=8 run before_k3_16 /work/before_claims 16 "--draft-steps 3"
run now_whole80 /work/main 80 ""
touch $R/DONE
