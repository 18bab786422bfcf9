#!/usr/bin/env bash
# The run still to do. Issue 25's trainer goal, strict: the code of 54207b2 (/tmp/old) against today's, same rows, same
# H100, serial timing. Today's adds, untimed so far: the step's host-to-device copies through pinned memory
# (common/transfer.py: a pageable copy makes CUDA wait for the stream, so each step began by waiting for the previous
# one's kernels), timed against the tree before it (2ede7bb, /tmp/prev), and the target's capture as one compiled graph.
# Carry .dev/w + .dev/tgtB, then .dev/tgtA + .dev/g16 (sg_train_600.jsonl, old54207b2.tgz, prev2ede7bb.tgz: git archive,
# results removed); untar both into /tmp, today's repo to /tmp/repo2 (git ls-files), the target to /tmp/tgt.
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
tp old /tmp/old $W 3 &
tp prev_step /tmp/prev $W 3 $OLD trainer.compile_scope=step &
tp step /tmp/repo2 $W 3 $OLD trainer.compile_scope=step &
wait; stamp "wave1 done"
W=$R/wave2; mkdir -p $W  # three at a time: GPU memory for six compiling runs at once is not known
tp step_cap /tmp/repo2 $W 3 $OLD trainer.compile_scope=step target.compile_capture=true --profile 2 &
tp regions /tmp/repo2 $W 3 $OLD &
tp recipe_step_cap /tmp/repo2 $W 3 trainer.compile_scope=step target.compile_capture=true &
wait; stamp "wave2 done"
cd /tmp/repo2 && python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py -k "compiled_training_step or flex_training_step or pinned" > $R/gpu_tests.txt 2>&1; stamp "gpu tests rc=$?"
touch $R/DONE
