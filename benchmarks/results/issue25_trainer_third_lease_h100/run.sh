#!/usr/bin/env bash
# RESULT: FA4 did not load (fa4_check.txt: no module 'cutlass' with pip --target; the registry's nvidia-cutlass-dsl-libs-base 4.8.1
# holds cutlass/_mlir but no cutlass/cute sources), so every run below is flex; the trainer picked flex and said so in one line.
# Session 19: the DFlash trainer with FlashAttention-4 installed (the trainer's `auto` then picks its key-interval kernels)
# against 54207b2 in the same environment, same protocol as issue25_trainer_rerun_h100; then GPU tests.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/res; rm -rf $R; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
stamp start
S=/tmp/stage
cat $S/fa4a/cu13.part00 $S/fa4b/cu13.part01 $S/fa4c/cu13.part02 > $S/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
md5sum $S/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl > $R/md5.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $S/w/*.whl $S/fa4s/*.whl $S/*.whl > $R/pip.txt 2>&1
stamp "pip rc=$?"
mkdir -p /tmp/tgt && cp -r $S/tgtA/. $S/tgtB/. /tmp/tgt/
mkdir -p /tmp/g && tar xzf $S/g2.tgz -C /tmp/g && rm -rf /tmp/old && mkdir -p /tmp/oldp && tar xzf /tmp/g/old54207b2.tgz -C /tmp/oldp && mv /tmp/oldp/old /tmp/old
rm -rf /tmp/repo2 && cp -r /tmp/repo /tmp/repo2
cp /tmp/repo2/benchmarks/train_throughput.py /tmp/old/benchmarks/train_throughput.py
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
cd /tmp/repo2
python3 -c "from kernels import fa4_adapter as a; print(a.installed_version(), a.check(), a.available())" > $R/fa4_check.txt 2>&1
stamp "fa4 check rc=$?"
C="target.path=/tmp/tgt data.path=/tmp/g/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
A="--steps 30 --warmup 10"
tp() {  # name code-dir wave-dir runs-in-wave overrides...
  local name=$1 dir=$2 wave=$3 n=$4; shift 4
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" $A \
     --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=$R/wave1; mkdir -p $W
tp old /tmp/old $W 3 &
tp new /tmp/repo2 $W 3 $OLD $CAP &
tp newflex /tmp/repo2 $W 3 $OLD $CAP trainer.attention_backend=flex &
wait; stamp "wave1 done"
W=$R/wave2; mkdir -p $W
tp oldflex /tmp/old $W 3 trainer.attention_backend=flex &
tp new_b /tmp/repo2 $W 3 $OLD $CAP &
tp old_b /tmp/old $W 3 &
wait; stamp "wave2 done"
W=$R/wave3; mkdir -p $W
tp old_c /tmp/old $W 3 &
tp new_c /tmp/repo2 $W 3 $OLD $CAP &
tp recipe /tmp/repo2 $W 3 target.compile_capture=true &
wait; stamp "wave3 done"
timeout 300 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_gpu.py tests/test_key_intervals_gpu.py -k "fa4 or compiled_training_step" > $R/gpu_tests_fa4.txt 2>&1
stamp "fa4 tests rc=$?"
timeout 400 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_static_target.py tests/test_static_drafters.py tests/test_skinny_gemm.py -k "triton or cuda or gpu or bf16" > $R/gpu_tests.txt 2>&1
stamp "static tests rc=$?"
touch $R/done
