cd /work/main
R=/work/main/benchmarks/results/batch_throughput_cpu_drafter_prepack; mkdir -p $R
T=/work/shared/targets/qwen3-27m-sharegpt; D=/work/recipe_export
run() { # name dir extra
  (cd $2 && /work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions 16 --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter $3 --out $R/$1.json > $R/$1.txt 2> $R/$1.err)
  echo "$1 rc=$? $(date +%T)" >> $R/times.txt
}
lscpu > $R/lscpu.txt
run before_whole /work/before_prepack ""
run now_whole /work/main ""
run before_k3 /work/before_prepack "--draft-steps 3"
run now_k3 /work/main "--draft-steps 3"
touch $R/DONE
