# The DFlash runs failed first (D was the run folder, which held no export: rc=1 in times.txt); they were rerun with
# D=EXPORT (python -m train.export RUN EXPORT --format dflash) by the same loop without the prompt-lookup line.
cd /work/main
R=benchmarks/results/batch_throughput_cpu_dflash_draft_steps
D=/work/cpu_drafter/export
T=/work/shared/targets/qwen3-27m-sharegpt
for K in full 7 3; do
  EXTRA=""; [ $K != full ] && EXTRA="--draft-steps $K"
  /work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions 16 --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter $EXTRA --out $R/dflash16_k$K.json > $R/dflash16_k$K.txt 2> $R/dflash16_k$K.err
  echo "k$K rc=$? $(date +%T)" >> $R/times.txt
done
/work/venv/bin/python benchmarks/batch_throughput.py --target $T --questions 16 --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only pld --out $R/pld16.json > $R/pld16.txt 2> $R/pld16.err
echo "pld rc=$? $(date +%T)" >> $R/times.txt
touch $R/DONE
