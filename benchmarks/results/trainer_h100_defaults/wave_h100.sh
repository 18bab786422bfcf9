#!/bin/bash
# Issue 25's pair on an H100 (after setup.sh 1-3; FA4 in both trees): 54207b2 (its own recipe, its auto = FA4) against
# the tree in the old tree's settings: target.compile_capture off / the reference target's default now (on) / that
# with Inductor's C++ wrapper. Every run compiled side by side, timed one after another (--serial-timing).
#   bash .dev/wave_h100.sh NWAVES [profile]
set -u
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
NEW=$PWD; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
for k in $(seq 1 $1); do
  R=/tmp/res_${k}_$RANDOM; W=/tmp/wave_$RANDOM; rm -rf $R $W; mkdir -p $R $W; T0=$(date +%s)
  stamp() { echo "$(( $(date +%s) - T0 )) s $*" >> $R/times.txt; }
  tp() { local name=$1 dir=$2; shift 2
    ( cd $dir && exec env SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$name $ENVX timeout 540 python3 benchmarks/train_throughput.py \
       experiment=dflash_swa_small $C "$@" --serial-timing $W 4 --json $R/$name.json > $R/$name.txt 2>&1 ) &
    local pid=$!; echo "$pid $name" >> $R/pids.txt; wait $pid; local rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc"; }
  P=""; [ "${2:-}" = profile ] && [ $k = 1 ] && P="--profile 2"
  stamp start
  ENVX= tp old /tmp/old --steps 30 --warmup 10 &
  ENVX= tp nocap $NEW $OLD target.compile_capture=false --steps 30 --warmup 10 &
  ENVX= tp defaults $NEW $OLD --steps 30 --warmup 10 $P &
  ENVX=TORCHINDUCTOR_CPP_WRAPPER=1 tp cppw $NEW $OLD --steps 30 --warmup 10 &
  wait; stamp "wave done"
  for f in $W/ready.*; do p=${f##*.}; echo "ready $(grep "^$p " $R/pids.txt | cut -d' ' -f2) $(( $(stat -c %Y $f) - T0 )) s"; done >> $R/times.txt
  for f in $R/*.json; do python3 -c "import json; d=json.load(open('$f')); print('%-10s %8.1f ms (host %6.1f) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['ms_per_step'], d['host_ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
  python3 - $R >> $R/summary.txt <<'PY'
import json, os, sys
r = sys.argv[1]; d = {n: json.load(open(f"{r}/{n}.json"))["tokens_per_s"] for n in ("old", "nocap", "defaults", "cppw") if os.path.exists(f"{r}/{n}.json")}
print("  ".join(f"{n} {v / d['old']:.2f}x" for n, v in d.items() if n != "old") if "old" in d else "no old")
PY
  echo "== wave $k"; cat $R/summary.txt $R/times.txt; tar czf $OUT/wave$k.tgz -C $R .
done
