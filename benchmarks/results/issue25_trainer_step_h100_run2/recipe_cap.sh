#!/usr/bin/env bash
# dflash_swa_small's own recipe with and without target.compile_capture, twice each in one wave (serial timing), with
# --profile 2: run2's single pair had the compiled capture slower (67.2 against 64.7 ms) where the old recipe gains 12%.
# Same setup as run.sh (its first call, then .dev/tgtA + .dev/g16); today's repo copied with cp -r.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res19; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
C="target.path=/tmp/tgt data.path=/tmp/g16/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
stamp start
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
tp() {  # name wave-dir runs-in-wave overrides...
  local name=$1 wave=$2 n=$3; shift 3
  (cd /tmp/repo2 && SWA_DRAFTERS_CACHE=/tmp/swacache_$name python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" \
     --steps 30 --warmup 10 --profile 2 --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?
   [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=$R/wave1; mkdir -p $W
tp recipe $W 4 &
tp recipe_cap $W 4 target.compile_capture=true &
tp recipe_b $W 4 &
tp recipe_cap_b $W 4 target.compile_capture=true &
wait; stamp "wave1 done"
touch $R/DONE
