cd /work/main
R=benchmarks/results/batch_throughput_cpu_recipe_drafter
D=/work/recipe_export
T=/work/shared/targets/qwen3-27m-sharegpt
/work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions 80 --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter --out $R/dflash80_kfull.json > $R/dflash80_kfull.txt 2> $R/dflash80_kfull.err
echo "kfull 80 rc=$? $(date +%T)" >> $R/times.txt
/work/venv/bin/python benchmarks/batch_throughput.py --target $T --drafter $D --questions 80 --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter --draft-steps 3 --out $R/dflash80_k3.json > $R/dflash80_k3.txt 2> $R/dflash80_k3.err
echo "k3 80 rc=$? $(date +%T)" >> $R/times.txt
