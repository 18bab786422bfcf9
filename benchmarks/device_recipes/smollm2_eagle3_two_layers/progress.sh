#!/bin/bash
# wait until the pipeline is done or WAIT seconds from T0 have passed, then say where it is and copy what exists to $OUT
WAIT=$1 T0=${2:-$(date +%s)}; W=${SM_DIR:-/tmp/sm}  # SM_DIR: the pipeline's folder elsewhere (tests)
while ! grep -q "all done" $W/times.txt 2>/dev/null && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
cat $W/times.txt 2>/dev/null
for f in regen probe train; do [ -f $W/$f.log ] && { echo "== $f"; tr '\r' '\n' < $W/$f.log | grep -E "regenerat|packed|drafter:|step [0-9]+:|stopping|Error|error|compile cache|exported|done:" | grep -v "it/s\]" | tail -6 | cut -c1-300; }; done
for f in probe run; do [ -f $W/$f/metrics.jsonl ] && { echo "== $f metrics"; tail -n 2 $W/$f/metrics.jsonl | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k in ('step', 'train/loss', 'train/acc', 'train/sim_tau', 'train/tokens_per_s', 'train/lr', 'train/tokens')})"; }; done
[ -f $W/prefill_check.log ] && { echo "== prefill check (ms a wave; ours: no cuDNN)"; grep "^| " $W/prefill_check.log | head -6; }
for f in $W/eval_*.log; do [ -f "$f" ] && { echo "== $f"; grep -A4 "^| turns" "$f" | head -5; grep "vLLM" "$f"; tail -1 "$f"; }; done
# what comes back from a call: at most 8 files of 16 MiB, 64 MiB together. So the logs travel as one archive, the
# regenerated file's pieces (once packed, in the first call that finds them) with the logs alone, and the drafter's
# pieces, the evaluations and the logs in a call after both
L=${W}_logs; rm -rf $L; mkdir -p $L; cp $W/times.txt $W/*.log $W/pipeline.out $L/ 2>/dev/null
for f in probe run; do [ -f $W/$f/metrics.jsonl ] && cp $W/$f/metrics.jsonl $L/${f}_metrics.jsonl; [ -f $W/$f/run.json ] && cp $W/$f/run.json $L/${f}_run.json; done
tar czf $OUT/logs.tgz -C $L . 2>/dev/null
if ls $W/ret/regen.jsonl.xz.part* >/dev/null 2>&1 && [ ! -f $W/ret_returned ]; then
  cp $W/ret/* $OUT/ && touch $W/ret_returned && echo "returning the regenerated file: $(ls $W/ret | tr '\n' ' ')"
  grep -q "all done" $W/times.txt 2>/dev/null && echo "the drafter comes back with the next call: bash /tmp/sm/progress.sh 0"
elif grep -q "all done" $W/times.txt 2>/dev/null; then
  cd $W && ls -d eval_*/ >/dev/null 2>&1 && tar czf $OUT/evals.tgz eval_*/ 2>/dev/null
  # the drafter's export without the target's embedding (rebuilt from the target), bf16, in pieces
  [ -f $W/run/export/model.safetensors ] && python3 -c "
from safetensors.torch import load_file, save_file
sd = load_file('$W/run/export/model.safetensors')
save_file({k: (v.bfloat16() if v.is_floating_point() else v) for k, v in sd.items() if 'embed_tokens' not in k}, '$W/drafter_noembed.safetensors')" \
  && cp $W/run/export/config.json $OUT/drafter_config.json && split -b 15000000 -d $W/drafter_noembed.safetensors $OUT/drafter_noembed.safetensors.part
fi
ls $OUT | wc -l; du -sh $OUT; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader 2>/dev/null || true
