#!/usr/bin/env bash
# Issue 25's trainer goal, second machine: 54207b2's code (/tmp/old) against today's with the step compiled whole and
# the target's capture compiled (target.compile_capture=true), same rows, same H100, serial timing, twice; the current
# recipe with and without the compiled capture; then the 8B-shape step with compile_scope=regions and =step.
# Carry .dev/w + .dev/tgtB, then .dev/tgtA + .dev/g16 (sg_train_600.jsonl, old54207b2.tgz); untar into /tmp, today's
# repo to /tmp/repo2 (cp -r of the carried tree: the device's .git may be an older commit's, so git ls-files there can
# miss today's files), the target to /tmp/tgt. The 8B loop ran as a second call with the overrides before the options
# (after --windows they were read as windows; train_step.py now rejects that with a clear error).
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res18; mkdir -p $R
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
W=$R/wave1; mkdir -p $W
tp old /tmp/old $W 4 &
tp step_cap /tmp/repo2 $W 4 $OLD trainer.compile_scope=step target.compile_capture=true &
tp recipe_step /tmp/repo2 $W 4 trainer.compile_scope=step &
tp recipe_step_cap /tmp/repo2 $W 4 trainer.compile_scope=step target.compile_capture=true &
wait; stamp "wave1 done"
W=$R/wave2; mkdir -p $W
tp old_b /tmp/old $W 2 &
tp step_cap_b /tmp/repo2 $W 2 $OLD trainer.compile_scope=step target.compile_capture=true &
wait; stamp "wave2 done"
cd /tmp/repo2
for scope in regions step; do
  python3 benchmarks/train_step.py trainer.compile_scope=$scope --shape qwen3-8b --drafter dflash --seq 3072 --windows 2048 > $R/step8b_$scope.txt 2>&1; stamp "8b $scope rc=$?"
done
touch $R/DONE
