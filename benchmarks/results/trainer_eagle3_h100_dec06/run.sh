#!/bin/bash
# 2026-12-06: issue 25's EAGLE-3 trainer pair on an H100, flex attention in both trees (no FA4 installed):
# 54207b2's own eagle3_swa_small recipe against this tree (HEAD, unpacked from .whl/head.tgz) in the old tree's settings,
# compiled whole (trainer.compile_scope=step, the default), compiled side by side, timed one after another
# (--serial-timing); waves while time is left. Same as results/decode_speed_h100_dec05_sixth/callK.sh less its cuDNN tests.
set -u; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
# the reference target travels as .whl/tgt.tar.xz (xz of the 53 MB folder: the call carries at most 64 MiB)
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || python3 -c "import tarfile; tarfile.open('.whl/tgt.tar.xz').extractall('/tmp/tgt')"
TGT=/tmp/tgt/qwen3-27m-sharegpt
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$TGT
rm -rf /tmp/old /tmp/new && mkdir -p /tmp/old /tmp/new && tar xzf .whl/old54207b2.tgz -C /tmp/old && tar xzf .whl/head.tgz -C /tmp/new
cp /tmp/new/benchmarks/train_throughput.py /tmp/old/benchmarks/
gunzip -c .whl/sg_train_600.jsonl.gz > /tmp/sg_train_600.jsonl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt; cat $OUT/gpu.txt
C="target.path=$TGT data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLDE3="drafter.ttt_length=7 drafter.norm_before_fc=false drafter.norm_output=false trainer.optimizer=adamw"
T00=$(date +%s)
for k in 1 2 3; do
  [ $k -gt 1 ] && [ $(( $(date +%s) - T00 )) -gt ${STOP:-300} ] && break
  R=$OUT/wave$k; W=/tmp/wave_$k; rm -rf $W; mkdir -p $R $W
  tp() { local name=$1 dir=$2; shift 2
    (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$name timeout 280 python3 benchmarks/train_throughput.py \
       experiment=eagle3_swa_small $C "$@" --serial-timing $W 2 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; echo "$name rc=$rc") ; }
  tp old /tmp/old --steps 20 --warmup 5 &
  tp new /tmp/new $OLDE3 --steps 20 --warmup 5 &
  wait
  for n in old new; do python3 -c "import json; d=json.load(open('$R/$n.json')); print('wave $k %-4s %7.1f ms (host %6s) %9.0f tok/s  backend %s  loss[0,1,-1] %.4f %.4f %.4f' % ('$n', d['ms_per_step'], '%.1f' % d['host_ms_per_step'] if 'host_ms_per_step' in d else '-', d['tokens_per_s'], d.get('attention', d.get('attention_backend', '?')), d['losses'][0], d['losses'][1], d['losses'][-1]))" 2>&1 | tail -1; done
  python3 -c "import json; o=json.load(open('$R/old.json'))['tokens_per_s']; n=json.load(open('$R/new.json'))['tokens_per_s']; print('wave $k ratio %.2fx' % (n/o))" 2>&1 | tail -1
  echo "t=$(( $(date +%s) - T00 )) s"
done
