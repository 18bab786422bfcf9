# Issue 24's CPU goal with the recipe's trained DFlash drafter (dflash_swa_small as committed, trained on an H100 this
# session: results/issue24_recipe_drafter_h100), carried back as EXPORT; each K one run, nothing else on the machine.
cd /work/main
R=benchmarks/results/batch_throughput_cpu_recipe_drafter
D=/work/recipe_export
T=/work/shared/targets/qwen3-27m-sharegpt
lscpu > $R/lscpu.txt
for K in full 7 3; do
  EXTRA=""; [ $K != full ] && EXTRA="--draft-steps $K"
  /work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions 16 --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter $EXTRA --out $R/dflash16_k$K.json > $R/dflash16_k$K.txt 2> $R/dflash16_k$K.err
  echo "k$K rc=$? $(date +%T)" >> $R/times.txt
done
/work/venv/bin/python benchmarks/batch_throughput.py --target $T --questions 16 --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only pld --out $R/pld16.json > $R/pld16.txt 2> $R/pld16.err
echo "pld rc=$? $(date +%T)" >> $R/times.txt
touch $R/DONE
# then, all 80 MT-Bench conversations with --draft-steps 3 (less of the batch's end drains with one row left)
/work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions 80 --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter --draft-steps 3 --out $R/dflash80_k3.json > $R/dflash80_k3.txt 2> $R/dflash80_k3.err
echo "k3 80 rc=$? $(date +%T)" >> $R/times.txt
