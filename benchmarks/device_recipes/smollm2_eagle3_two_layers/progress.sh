#!/bin/bash
# wait until the pipeline is done or WAIT seconds from T0 have passed, then say where it is and copy what exists to $OUT
WAIT=$1 T0=${2:-$(date +%s)}; W=/tmp/sm
while ! grep -q "all done" $W/times.txt 2>/dev/null && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
cat $W/times.txt 2>/dev/null
for f in regen probe train; do [ -f $W/$f.log ] && { echo "== $f"; tr '\r' '\n' < $W/$f.log | grep -E "regenerat|packed|drafter:|step [0-9]+:|stopping|Error|error|compile cache|exported|done:" | grep -v "it/s\]" | tail -6 | cut -c1-300; }; done
for f in probe run; do [ -f $W/$f/metrics.jsonl ] && { echo "== $f metrics"; tail -n 2 $W/$f/metrics.jsonl | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k in ('step', 'train/loss', 'train/acc', 'train/sim_tau', 'train/tokens_per_s', 'train/lr', 'train/tokens')})"; }; done
for f in $W/eval_*.log; do [ -f "$f" ] && { echo "== $f"; grep -A4 "^| turns" "$f" | head -5; grep "vLLM" "$f"; tail -1 "$f"; }; done
mkdir -p $OUT/logs; cp $W/times.txt $W/*.log $W/pipeline.out $OUT/logs/ 2>/dev/null
for f in probe run; do [ -f $W/$f/metrics.jsonl ] && cp $W/$f/metrics.jsonl $OUT/logs/${f}_metrics.jsonl; [ -f $W/$f/run.json ] && cp $W/$f/run.json $OUT/logs/${f}_run.json; done
cd $W && ls -d eval_*/ >/dev/null 2>&1 && tar czf $OUT/evals.tgz eval_*/ 2>/dev/null
if grep -q "all done" $W/times.txt 2>/dev/null; then
  cp $W/ret/* $OUT/ 2>/dev/null
  # the drafter's export without the target's embedding (rebuilt from the target), bf16, in pieces: it fits beside the
  # regenerated file in the 64 MiB a call returns
  [ -f $W/run/export/model.safetensors ] && python3 -c "
from safetensors.torch import load_file, save_file
sd = load_file('$W/run/export/model.safetensors')
save_file({k: (v.bfloat16() if v.is_floating_point() else v) for k, v in sd.items() if 'embed_tokens' not in k}, '$W/drafter_noembed.safetensors')" \
  && cp $W/run/export/config.json $OUT/drafter_config.json && split -b 15000000 -d $W/drafter_noembed.safetensors $OUT/drafter_noembed.safetensors.part
fi
du -sh $OUT; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
