#!/bin/bash
# call B: resume the training to its 2,500 steps (exports), then the chain and the trees (with and without prompt lookup's
# chain as one more branch) on MT-Bench and the held-out prompts, prompt lookup beside, batch 16, 256 new tokens
T0=$(date +%s); export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache
W=/tmp/e3; stamp() { echo "$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a $W/times.txt; }
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || { echo "machine is fresh: run callA first"; exit 3; }
A=(experiment=eagle3_swa_small logger=none target.path=/tmp/tgt/qwen3-27m-sharegpt data.path=/tmp/pf/p5000.jsonl data.max_records=5000
   trainer.max_steps=2500 trainer.checkpoint_every=250 trainer.eval_every=100000 trainer.loop_eval_prompts=0 trainer.progress=false output_dir=$W/run)
if [ ! -f $W/run/export/config.json ]; then
  stamp "train resume"; python3 -m train "${A[@]}" trainer.max_steps=2000 >> $W/train.log 2>&1; stamp "train rc=$?"
fi
grep -E "done:|held-out replies" $W/train.log | tail -2
D=$W/run; H=/tmp/pf/sharegpt_heldout_prompts.jsonl
E="--drafter $D --max-new-tokens 256 --batch-size 16 --no-baseline"
ev() {
  local name=$1; shift
  (python3 -m eval mtbench $E "$@" --out $W/mtbench_$name > $W/mtbench_$name.log 2>&1; stamp "$name mtbench rc=$?") &
  (python3 -m eval prompts --prompts $H $E "$@" --out $W/heldout_$name > $W/heldout_$name.log 2>&1; stamp "$name heldout rc=$?") &
  wait
}
ev k15 --draft-steps 15 &
ev k16n384d16l16 --tree-topk 16 --tree-tokens 384 --draft-steps 16 --tree-lookup 16 &
wait; stamp "wave 1 done"
(cd $W && tar czf $OUT/wave1.tgz times.txt train.log run/metrics.jsonl *_k*/results.json *_k*.log 2>/dev/null)
tar czf $OUT/export.tgz -C $W/run export 2>/dev/null
[ $(( $(date +%s) - T0 )) -gt 400 ] && { stamp "no time for wave 2"; exit 0; }
ev k10n128d12l12 --tree-topk 10 --tree-tokens 128 --draft-steps 12 --tree-lookup 12 &
ev k16n384d16 --tree-topk 16 --tree-tokens 384 --draft-steps 16 --no-pld &
wait; stamp "wave 2 done"
cd $W && tar czf $OUT/results.tgz times.txt gpu.txt tree.txt train.log run/metrics.jsonl run/run.json *_k*/results.json *_k*/*.md *_k*.log 2>/dev/null
tar czf $OUT/export.tgz -C $W/run export 2>/dev/null; ls -la $OUT
for f in $W/*_k*/results.json; do python3 -c "
import json,sys; r=json.load(open('$f')); s=r['summary']; p=s.get('prompt_lookup',{})
print('$f'.split('/')[-2], 'tau %.3f' % s['tau'], 'pld', p.get('tau'), p.get('tau_drafting_steps'))"; done
