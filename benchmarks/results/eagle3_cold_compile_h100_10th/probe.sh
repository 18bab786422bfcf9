#!/bin/bash
# one call: EAGLE-3's cold compile on the reference target, one decoder layer against two, side by side (own Inductor
# and Triton caches each), packed 16 x 2048 rows of the builtin sample, flex; the time of each process's first metrics
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -1
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
nvidia-smi --query-gpu=name --format=csv,noheader
T0=$(date +%s)
for L in 1 2; do
  types=$(python3 -c "print('[' + ','.join(['sliding_attention'] * $L) + ']')")
  mkdir -p /tmp/ind$L /tmp/tri$L
  ( TORCHINDUCTOR_CACHE_DIR=/tmp/ind$L TRITON_CACHE_DIR=/tmp/tri$L timeout 300 python3 -m train experiment=eagle3_swa_small logger=none \
      target.path=.gl/ref data.path=builtin:sharegpt-sample data.regenerate.enabled=false data.max_records=null \
      drafter.draft_vocab_size=8192 drafter.num_hidden_layers=$L "drafter.layer_types=$types" data.pack_documents=true \
      data.pack_length=2048 data.num_eval=0 trainer.attention_backend=flex trainer.max_steps=40 trainer.log_every=10 \
      trainer.export=false trainer.checkpoint_every=0 trainer.progress=false output_dir=$OUT/l$L > $OUT/l$L.log 2>&1
    echo "layers $L rc=$? at $(( $(date +%s) - T0 )) s" >> $OUT/times.txt ) &
  ( while [ ! -s $OUT/l$L/metrics.jsonl ] && [ $(( $(date +%s) - T0 )) -lt 300 ]; do sleep 1; done
    echo "layers $L first metrics (step 10) at $(( $(date +%s) - T0 )) s" >> $OUT/times.txt ) &
done
wait
cat $OUT/times.txt; for L in 1 2; do grep -E "drafter:|Error|error" $OUT/l$L.log | tail -3 | cut -c1-250; python3 -c "
import json
for l in open('$OUT/l$L/metrics.jsonl'): r = json.loads(l); print($L, r['step'], round(r['train/tokens_per_s']), round(r['train/loss'], 3))" 2>/dev/null; done
