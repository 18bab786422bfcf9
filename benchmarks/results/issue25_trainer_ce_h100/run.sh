#!/usr/bin/env bash
# Issue 25's trainer goal, strict: 54207b2's code (/tmp/old) against today's, the step compiled whole and the target's
# capture compiled, before (/tmp/prevce, the tree before train/cross_entropy.py) and after (/tmp/repo2) the
# cross-entropy that keeps no fp32 log-softmax for the backward; same rows (sg_train_600.jsonl), same H100, serial
# timing, two waves; the shipped recipe before/after; the 8B-shape step before/after (MFU must not drop); GPU tests.
# Carry .dev/w + .dev/tgtB, then .dev/tgtA + .dev/g18 (old54207b2.tgz, prevce.tgz = git archive of the commit before,
# sg_train_600.jsonl); untar into /tmp, today's repo to /tmp/repo2 with cp -r of the carried tree.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res22; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
C="target.path=/tmp/tgt data.path=/tmp/g18/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
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
tp prev_cap /tmp/prevce $W 4 $OLD $CAP &
tp ce_cap /tmp/repo2 $W 4 $OLD $CAP --profile 2 &
tp ce_cap2 /tmp/repo2 $W 4 $OLD $CAP &
wait; stamp "wave1 done"
W=$R/wave2; mkdir -p $W
tp old_b /tmp/old $W 3 &
tp ce_cap_b /tmp/repo2 $W 3 $OLD $CAP &
tp prev_cap_b /tmp/prevce $W 3 $OLD $CAP &
wait; stamp "wave2 done"
W=$R/wave3; mkdir -p $W
tp recipe_prev /tmp/prevce $W 2 &
tp recipe_ce /tmp/repo2 $W 2 &
wait; stamp "wave3 done"
for t in prevce repo2; do
  (cd /tmp/$t && python3 benchmarks/train_step.py --shape qwen3-8b --drafter dflash --seq 3072 --windows 2048 > $R/step8b_$t.txt 2>&1; stamp "8b $t rc=$?")
done
cd /tmp/repo2 && python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py -k "compiled_training_step or flex_training_step" tests/test_cross_entropy.py > $R/gpu_tests.txt 2>&1; stamp "gpu tests rc=$?"
touch $R/DONE
