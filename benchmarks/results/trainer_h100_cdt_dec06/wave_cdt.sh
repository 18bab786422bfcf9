#!/bin/bash
# 2026-12-06 (third session), an H100, after setup.sh 1-3 (FA4 4.0.0b36 in both trees): DFlash in the old tree's settings,
# 54207b2 (its own recipe, its auto = FA4) against today's defaults and today's with trainer.coordinate_descent_tuning=true.
# Compiled side by side, timed one after another (--serial-timing). bash .dev/wave_cdt.sh WAVE [profile]
set -u
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/res$1; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/res$1.tgz -C $R .' EXIT; NEW=$PWD
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
echo "tree $(cat .dev/tree.txt)" > $R/tree.txt
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $R/gpu.txt; nproc >> $R/gpu.txt
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
W=/tmp/wave$1; rm -rf $W; mkdir -p $W
tp() { local name=$1 dir=$2; shift 2
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$name timeout ${TMO:-500} python3 benchmarks/train_throughput.py \
     experiment=dflash_swa_small $C "$@" --serial-timing $W 3 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; stamp "$name rc=$rc") ; }
P=""; [ "${2:-}" = profile ] && P="--profile 2"
stamp start
tp old /tmp/old --steps 30 --warmup 10 &
tp defaults $NEW $OLD --steps 30 --warmup 10 &
tp cdt $NEW $OLD trainer.coordinate_descent_tuning=true --steps 30 --warmup 10 $P &
wait; stamp "wave done"
for f in $R/*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('%-8s %-5s %8.1f ms (host %6s) %9.0f tok/s  loss[0,1,-1] %.4f %.4f %.4f' % ('$(basename $f .json)', d['attention'], d['ms_per_step'], '%.1f' % d['host_ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][1], d['losses'][-1]))"; done > $R/summary.txt
python3 - $R >> $R/summary.txt <<'PY'
import json, os, sys
r = sys.argv[1]; d = {n: json.load(open(f"{r}/{n}.json"))["tokens_per_s"] for n in ("old", "defaults", "cdt") if os.path.exists(f"{r}/{n}.json")}
print("  ".join(f"{n} {v / d['old']:.2f}x" for n, v in d.items() if n != "old") if "old" in d else "no old")
PY
cat $R/summary.txt; cat $R/times.txt; grep -h "GPU busy" $R/*.txt | cut -c1-200
