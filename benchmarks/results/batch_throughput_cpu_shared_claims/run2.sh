# Alternating repeats of batch 8 (the batch-1 path is the same code in both trees), 16 conversations, three pairs each
R=/work/main/benchmarks/results/batch_throughput_cpu_shared_claims
T=/work/shared/targets/qwen3-27m-sharegpt; D=/work/recipe_export
run() { # name dir questions extra
  (cd $2 && /work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions $3 --max-new-tokens 128 --batch-sizes 8 --threads 2 --only drafter $4 --out $R/$1.json > $R/$1.txt 2> $R/$1.err)
  echo "$1 rc=$? $(date +%T)" >> $R/times.txt
}
for i in 1 2 3; do
  run rep${i}_before_whole16 /work/before_claims 16 ""
  run rep${i}_now_whole16 /work/main 16 ""
  run rep${i}_before_k3_16 /work/before_claims 16 "--draft-steps 3"
  run rep${i}_now_k3_16 /work/main 16 "--draft-steps 3"
done
touch $R/DONE2
