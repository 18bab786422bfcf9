#!/bin/bash
# One call on a fresh machine, no FA4 (flex in both trees): hydra/omegaconf/datasets wheels, the reference target, the
# data and 54207b2 from .dev/c1; then a wave of three cold compiles side by side (old; the tree as shipped; the tree with
# trainer.coordinate_descent_tuning=true), each on its own empty Inductor cache: time to ready (compile + 10 warm-up
# steps) and the timed steps. Everything written to $OUT as it comes.
set -u
T0=$(date +%s)
stamp() { echo "$(( $(date +%s) - T0 )) s $*" >> $OUT/times.txt; }
mkdir -p /tmp/site /tmp/tgt && cp .dev/c1/tgt/* /tmp/tgt/ && cp .dev/c1/sg_train_600.jsonl /tmp/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/c1/whl/*.whl > $OUT/pip.txt 2>&1
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf .dev/c1/old54207b2.tgz -C /tmp/old && cp benchmarks/train_throughput.py /tmp/old/benchmarks/
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
stamp "setup done"
C="target.path=/tmp/tgt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
CAP="trainer.compile_scope=step target.compile_capture=true"
W=/tmp/wave; rm -rf $W; mkdir -p $W; NEW=$PWD
tp() { local name=$1 dir=$2; shift 2
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$name timeout 215 \
     bash -c 'echo $$ > '$OUT/$name.pid'; exec python3 benchmarks/train_throughput.py "$@"' _ \
     experiment=dflash_swa_small $C "$@" --serial-timing $W 3 --json $OUT/$name.json > $OUT/$name.txt 2>&1; stamp "$name rc=$?") ; }
stamp "wave start"
tp old /tmp/old --steps 20 --warmup 10 &
tp new $NEW $OLD $CAP --steps 20 --warmup 10 &
tp new_cdt $NEW $OLD $CAP trainer.coordinate_descent_tuning=true --steps 20 --warmup 10 &
wait; stamp "wave done"
for n in old new new_cdt; do p=$(cat $OUT/$n.pid 2>/dev/null); for f in $W/ready.$p $W/failed.$p; do [ -e $f ] && echo "$(( $(stat -c %Y $f) - T0 )) s $n $(basename $f)"; done; done >> $OUT/times.txt
ps -eo pid,args | grep train_throughput >> $OUT/times.txt
for f in $OUT/*.json; do python3 -c "import json; d=json.load(open('$f')); print('%-8s %7.1f ms (host %6.1f) %9.0f tok/s  loss[0,-1] %.4f %.4f' % ('$(basename $f .json)', d['ms_per_step'], d['host_ms_per_step'], d['tokens_per_s'], d['losses'][0], d['losses'][-1]))"; done > $OUT/summary.txt
cat $OUT/summary.txt $OUT/times.txt
