#!/bin/bash
# one call: SmolLM2's EAGLE-3 step (16 x 2,048 rows, TTT 10, flex) compiled from empty caches, 8 soft-CE chunks a TTT step
# (the code before) beside 1 (the byte rule), two processes side by side; waits up to WAIT s, copies what exists to $OUT
set -u; T0=$(date +%s); W=/tmp/cc; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $W/gpu.txt; nproc >> $W/gpu.txt
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" >> $W/gpu.txt
for c in 8 1; do
  setsid nohup python3 benchmarks/eagle3_step_compile.py --shape smollm2-135m --rows 16x2048 --chunks $c --layers 1 --ttt 10 \
    > $W/chunks$c.txt 2>&1 < /dev/null &
done
while [ $(( $(date +%s) - T0 )) -lt ${WAIT:-560} ] && { ! grep -q "^| 1 " $W/chunks8.txt 2>/dev/null || ! grep -q "^| 1 " $W/chunks1.txt 2>/dev/null; }; do sleep 5; done
echo "elapsed $(( $(date +%s) - T0 )) s"; cat $W/gpu.txt; tail -n 4 $W/chunks*.txt; cp $W/*.txt $OUT/
