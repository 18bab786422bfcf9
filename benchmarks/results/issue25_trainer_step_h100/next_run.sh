#!/usr/bin/env bash
# The run still to do (round2_failed/trainer2.sh with its barrier folder made up front). Issue 25's trainer goal, strict, second round: the code of 54207b2 against compile_scope=step with the backward's
# tiles (now DFlash's default) and the target's capture compiled as one graph; same rows, same H100, serial timing.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res17; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
C="target.path=/tmp/tgt data.path=/tmp/g16/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
A="--steps 30 --warmup 10"
stamp start
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
tp() {  # name code-dir wave-dir runs-in-wave overrides...
  local name=$1 dir=$2 wave=$3 n=$4; shift 4
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" $A \
     --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=$R/wave1; mkdir -p $W  # a run that fails before its warm-up ends marks itself ready here (the folder must exist)
tp old /tmp/old $W 5 &
tp regions /tmp/repo2 $W 5 $OLD &
tp step /tmp/repo2 $W 5 $OLD trainer.compile_scope=step &
tp step_cap /tmp/repo2 $W 5 $OLD trainer.compile_scope=step target.compile_capture=true --profile 2 &
tp recipe_step_cap /tmp/repo2 $W 5 trainer.compile_scope=step target.compile_capture=true &
wait; stamp "wave1 done"
cd /tmp/repo2 && python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py -k "step-bwd-tiles or step-target-capture" > $R/gpu_tests.txt 2>&1; stamp "gpu tests rc=$?"
touch $R/DONE
