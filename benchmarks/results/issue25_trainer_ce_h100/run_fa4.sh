#!/usr/bin/env bash
# Issue 25's trainer goal, strict, with FlashAttention-4 installed (pip install '.[fa4]': trainer.attention_backend=auto
# then picks fa4 on Hopper): 54207b2's code (/tmp/old) against today's (/tmp/repo2) with flex and with fa4, the step
# compiled whole (and compiled regions for fa4), the target's capture compiled; same rows, same H100, serial timing.
# Setup as run.sh, plus FA4's wheels (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1 and its cu13 libs carried in 4
# pieces, quack-kernels, apache-tvm-ffi, torch-c-dlpack-ext, einops) installed with pip --target /tmp/site.
# RESULT: did not run. With those wheels unpacked (pip --target skipped the second wheel sharing nvidia_cutlass_dsl/;
# python -m zipfile -e did not) `import cutlass.cute` still failed, so kernels/fa4_adapter.check() refused fa4 in one
# line and the fa4 runs exited at start-up. Kept as the plan for a machine where '.[fa4]' installs.
set -u
# pip --target does not run nvidia-cutlass-dsl's .pth (it puts nvidia_cutlass_dsl/dsl_packages on sys.path): done here
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
R=/tmp/res23; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
C="target.path=/tmp/tgt data.path=/tmp/g18/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
A="--steps 30 --warmup 10"
stamp start
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
(cd /tmp/repo2 && python3 -c "import kernels.fa4_adapter as f; print(f.check())" > $R/fa4_check.txt 2>&1)
tp() {  # name code-dir wave-dir runs-in-wave overrides...
  local name=$1 dir=$2 wave=$3 n=$4; shift 4
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" $A \
     --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=$R/wave1; mkdir -p $W
tp old /tmp/old $W 4 &
tp flex_cap /tmp/repo2 $W 4 $OLD $CAP trainer.attention_backend=flex &
tp fa4_cap /tmp/repo2 $W 4 $OLD $CAP trainer.attention_backend=fa4 --profile 2 &
tp fa4_regions_cap /tmp/repo2 $W 4 $OLD trainer.compile_scope=regions target.compile_capture=true trainer.attention_backend=fa4 &
wait; stamp "wave1 done"
W=$R/wave2; mkdir -p $W
tp old_b /tmp/old $W 3 &
tp flex_cap_b /tmp/repo2 $W 3 $OLD $CAP trainer.attention_backend=flex &
tp fa4_cap_b /tmp/repo2 $W 3 $OLD $CAP trainer.attention_backend=fa4 &
wait; stamp "wave2 done"
touch $R/DONE
