#!/usr/bin/env bash
# dflash_swa_small's own recipe (Muon) with Muon's Newton-Schulz per matrix (the tree before, /tmp/prevmuon) and per
# shape as one stack (today's), twice each in one wave (serial timing), one of each profiled: recipe_cap.sh's profiles
# put Muon's step at ~28 ms of host and ~11 ms of GPU time a step. Setup as run.sh; call 2 carries .dev/tgtA + .dev/g17
# (sg_train_600.jsonl, prevmuon.tgz); today's repo copied with cp -r.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res20; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
C="target.path=/tmp/tgt data.path=/tmp/g17/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
stamp start
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
tp() {  # name code-dir wave-dir runs-in-wave extra-args...
  local name=$1 dir=$2 wave=$3 n=$4; shift 4
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" \
     --steps 30 --warmup 10 --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?
   [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=$R/wave1; mkdir -p $W
tp per_matrix /tmp/prevmuon $W 4 --profile 2 &
tp stacked /tmp/repo2 $W 4 --profile 2 &
tp per_matrix_b /tmp/prevmuon $W 4 &
tp stacked_b /tmp/repo2 $W 4 &
wait; stamp "wave1 done"
touch $R/DONE
