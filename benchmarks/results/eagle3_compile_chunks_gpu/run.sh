#!/bin/bash
# one call, carrying .whl (the wheels the image lacks: the script imports the trainer, which needs hydra; the twelfth
# session's first call lacked them and every case failed at its start). SmolLM2's EAGLE-3 step (16 x 2,048 rows, TTT 10)
# compiled from empty caches, two cases after each other in each of two processes side by side (they share the compile
# threads, so each pair's two cases are compared under the same load):
#   A1: flex, 8 soft-CE chunks a TTT step (the code before e669c8e)  B1: flex, 1 chunk (the byte rule)
#   A2: sdpa, 1 chunk (no flex kernels: flex's share is B1 - A2)       B2: flex, 1 chunk, --uniform-keys (one flex kernel
#                                                                          pair for all TTT steps, if the template dedupes)
# Waits up to WAIT s or until every case has ended (a table row or an error), copies what exists to $OUT. Called again on
# the warm machine (within 30 s), it starts nothing and waits for the cases still running.
set -u; T0=$(date +%s); W=/tmp/cc; mkdir -p $W
export PYTHONPATH=/tmp/site
S="python3 benchmarks/eagle3_step_compile.py --shape smollm2-135m --rows 16x2048 --layers 1 --ttt 10"
if [ ! -f $W/started ]; then
  touch $W/started
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $W/gpu.txt; nproc >> $W/gpu.txt
  python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" >> $W/gpu.txt
  git log -1 --format=%h >> $W/gpu.txt 2>/dev/null
  setsid nohup bash -c "$S --chunks 8 > $W/flex8.txt 2>&1; $S --chunks 1 --backend sdpa > $W/sdpa1.txt 2>&1" < /dev/null > /dev/null 2>&1 &
  setsid nohup bash -c "$S --chunks 1 > $W/flex1.txt 2>&1; $S --chunks 1 --uniform-keys > $W/flex1u.txt 2>&1" < /dev/null > /dev/null 2>&1 &
fi
ended() { grep -qE "^\| 1 |^error:" $W/$1.txt 2>/dev/null; }
alive() { pgrep -f "eagle3_step_compile.py" > /dev/null; }
while [ $(( $(date +%s) - T0 )) -lt ${WAIT:-560} ] && alive && { ! ended flex8 || ! ended flex1 || ! ended sdpa1 || ! ended flex1u; }; do sleep 5; done
echo "elapsed $(( $(date +%s) - T0 )) s in this call"; cat $W/gpu.txt; tail -n 4 $W/flex8.txt $W/flex1.txt $W/sdpa1.txt $W/flex1u.txt 2>/dev/null
cp $W/*.txt $OUT/
