#!/usr/bin/env bash
# Issue 25's trainer goal, strict: 54207b2's code (/tmp/old) against the tree before (/tmp/prev, ace5a20) and after
# (/tmp/repo2) the capture without a padding mask (train/trainer.py StepContext.target_features) and with
# SDPA's causal kernels in its compiled graph (models/target.py CAUSAL_SDPA), same rows
# (sg_train_600.jsonl), same H100, serial timing, two waves; then GPU tests (the packed-row DFlash caches of the
# previous session's cuda cases, the compiled capture and training steps). The 8B-shape step is not touched (its target
# forward is timed apart, benchmarks/train_step.py).
# Carry .dev/w + .dev/tgtB + .dev/g (old54207b2.tgz, prev.tgz = git archive of ace5a20, sg_train_600.jsonl), then
# .dev/tgtA; the old tree takes today's benchmarks/train_throughput.py (for --serial-timing); untar into /tmp, today's repo to /tmp/repo2 with cp -r of the carried tree.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/res; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
C="target.path=/tmp/tgt data.path=/tmp/g/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
A="--steps 30 --warmup 10"
stamp start
cp /tmp/repo2/benchmarks/train_throughput.py /tmp/old/benchmarks/train_throughput.py
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
tp() {  # name code-dir wave-dir runs-in-wave overrides...
  local name=$1 dir=$2 wave=$3 n=$4; shift 4
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" $A \
     --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=$R/wave1; mkdir -p $W
tp old /tmp/old $W 4 &
tp prev /tmp/prev $W 4 $OLD $CAP &
tp new /tmp/repo2 $W 4 $OLD $CAP --profile 2 &
tp new2 /tmp/repo2 $W 4 $OLD $CAP &
wait; stamp "wave1 done"
W=$R/wave2; mkdir -p $W
tp old_b /tmp/old $W 3 &
tp new_b /tmp/repo2 $W 3 $OLD $CAP &
tp prev_b /tmp/prev $W 3 $OLD $CAP &
wait; stamp "wave2 done"
cd /tmp/repo2 && timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_batch.py tests/test_static_drafters.py tests/test_target.py tests/test_gpu.py -k "cuda or gpu or causal or compiled_capture or compiled_training_step or flex_training_step" > $R/gpu_tests.txt 2>&1; stamp "gpu tests rc=$?"
touch $R/DONE
