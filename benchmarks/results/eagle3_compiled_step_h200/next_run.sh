#!/bin/bash
# NOT RUN (next session; an H100 preferred). Setup as in run_a.sh (FA4 + hydra wheels in /tmp/site, the target at /tmp/tgt,
# .dev/g with old54207b2.tgz and sg_train_600.jsonl). What this session's device time did not reach:
# 1. the 8B-shape EAGLE-3 step compiled whole against eager (issue 25: "the 8B-shape MFU must not drop");
# 2. EAGLE-3 with target.compile_capture now covering its capture (with_final_hidden; cbb2609) against compile_capture=false
#    (the eager capture, now without the packed-sequence check);
# 3. the one cudaStreamSynchronize per EAGLE-3 step seen in callA's profile (transformers' packed-sequence check, removed
#    since 9300302 for Qwen3 stacks): --sync-debug prints the stack of any synchronisation left, both capture paths.
set -u
mkdir -p /tmp/g && cp .dev/g/* /tmp/g/ && cp .dev/g/sg_train_600.jsonl /tmp/sg_train_600.jsonl
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/resN; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resN.tgz -C $R .' EXIT
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
cp .dev/g/tree.txt $R/; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLDE3="drafter.ttt_length=7 drafter.norm_before_fc=false drafter.norm_output=false trainer.optimizer=adamw"
W=/tmp/waveN; rm -rf $W; mkdir -p $W
tp() { local name=$1; shift 1
  (SWA_DRAFTERS_CACHE=/tmp/swacache_$name timeout 500 python3 benchmarks/train_throughput.py experiment=eagle3_swa_small $C $OLDE3 "$@" \
     --steps 20 --warmup 5 --serial-timing $W 2 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
stamp start
tp e3cap trainer.compile_scope=step target.compile_capture=true --sync-debug &
tp e3nocap trainer.compile_scope=step target.compile_capture=false --sync-debug &
wait; stamp "wave done"
grep -h "tokens/s\|loss by step" $R/e3*.txt | cut -c1-220; grep -h -A14 "^SYNC" $R/e3cap.txt $R/e3nocap.txt | head -80
for scope in step regions; do
  timeout 240 python3 benchmarks/train_step.py --shape qwen3-8b --drafter eagle3 --seq 3072 --windows 2048 trainer.compile_scope=$scope \
    > $R/step8b_eagle3_$scope.txt 2>&1; stamp "8b $scope rc=$?"; tail -4 $R/step8b_eagle3_$scope.txt
done
cat $R/times.txt
