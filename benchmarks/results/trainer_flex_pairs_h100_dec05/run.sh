#!/bin/bash
# Issue 25's trainer pair on an H100 without FA4 (both trees on flex attention): 54207b2 (its own recipe) against the
# tree in the old tree's settings, compiled side by side, timed one after another (--serial-timing); waves until ~330 s.
set -u; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1;
  sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py; }
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf .whl/old54207b2.tgz -C /tmp/old && cp benchmarks/train_throughput.py /tmp/old/benchmarks/
gunzip -c .whl/sg_train_600.jsonl.gz > /tmp/sg_train_600.jsonl; NEW=$PWD; T00=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
python3 -c "from kernels import fa4_adapter as a; print('fa4', a.installed_version(), a.available())" >> $OUT/gpu.txt 2>&1
C="target.path=$PWD/.target/qwen3-27m-sharegpt data.path=/tmp/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
for k in 1 2 3 4; do
  [ $k -gt 1 ] && [ $(( $(date +%s) - T00 )) -gt ${STOP:-300} ] && break
  R=$OUT/wave$k; W=/tmp/wave_$k; rm -rf $W; mkdir -p $R $W
  tp() { local name=$1 dir=$2; shift 2
    (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$name timeout 260 python3 benchmarks/train_throughput.py \
       experiment=dflash_swa_small $C "$@" --serial-timing $W 2 --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $W/ready.failed_$name; echo "$name rc=$rc") ; }
  tp old /tmp/old --steps 30 --warmup 10 &
  tp new $NEW $OLD --steps 30 --warmup 10 &
  wait
  for n in old new; do python3 -c "import json; d=json.load(open('$R/$n.json')); print('wave $k %-4s %7.1f ms (host %6.1f) %9.0f tok/s  backend %s  loss[0,1,-1] %.4f %.4f %.4f' % ('$n', d['ms_per_step'], d['host_ms_per_step'], d['tokens_per_s'], d.get('attention_backend', '?'), d['losses'][0], d['losses'][1], d['losses'][-1]))" 2>&1 | tail -1; done
  python3 -c "import json; o=json.load(open('$R/old.json'))['tokens_per_s']; n=json.load(open('$R/new.json'))['tokens_per_s']; print('wave $k ratio %.2fx' % (n/o))" 2>&1 | tail -1
  grep -h -E "tokens/s, .* ms/step" $R/*.txt | cut -c1-200; echo "t=$(( $(date +%s) - T00 )) s"
done
