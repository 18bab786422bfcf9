#!/bin/bash
# call 9: the reference target's last piece; FA4 GPU tests at today's code; the trainer's throughput with FA4 (auto) and flex,
# beside 54207b2 in the same waves (protocol of results/issue25_trainer_third_lease_h100/run.sh); the shipped recipe both ways.
set -u
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=$OUT; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
stamp start
mkdir -p /tmp/tgt && cp -r .dev/t4/. /tmp/tgt/ && ls /tmp/tgt > $R/tgt_files.txt
rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf .dev/g/old54207b2.tgz -C /tmp/old && cp benchmarks/train_throughput.py /tmp/old/benchmarks/
cp .dev/g/sg_train_600.jsonl /tmp/sg_train_600.jsonl
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
python3 -c "from kernels import fa4_adapter as a; print(a.installed_version(), a.check(), a.available())" > $R/fa4_check.txt 2>&1
(cd /tmp/old && python3 -c "from kernels import fa4_adapter as a; print('old tree:', a.installed_version(), a.check(), a.available())" >> $R/fa4_check.txt 2>&1)
stamp "fa4 check rc=$?"
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
A="--steps 30 --warmup 10"
tp() {  # name code-dir wave-dir runs-in-wave overrides...
  local name=$1 dir=$2 wave=$3 n=$4; shift 4
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 280 python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" $A \
     --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=/tmp/wave1; rm -rf $W; mkdir -p $W
tp old /tmp/old $W 4 &
tp new $NEW $W 4 $OLD $CAP &
tp oldflex /tmp/old $W 4 trainer.attention_backend=flex &
tp newflex $NEW $W 4 $OLD $CAP trainer.attention_backend=flex &
wait; stamp "wave1 done"
W=/tmp/wave2; rm -rf $W; mkdir -p $W
tp old_b /tmp/old $W 4 &
tp new_b $NEW $W 4 $OLD $CAP &
tp recipe $NEW $W 4 target.compile_capture=true &
tp recipeflex $NEW $W 4 target.compile_capture=true trainer.attention_backend=flex &
wait; stamp "wave2 done"
grep -h "tokens/s\|ms/step\|backend\|attention" $R/*.txt | head -40 > $R/summary.txt
timeout 200 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_gpu.py tests/test_key_intervals_gpu.py tests/test_window_attention.py tests/test_fa4_adapter.py -k "fa4 or key_interval or compiled_training_step or adapter" > $R/gpu_tests_fa4.txt 2>&1
stamp "fa4 tests rc=$?"
tail -5 $R/gpu_tests_fa4.txt
cat $R/times.txt $R/fa4_check.txt
