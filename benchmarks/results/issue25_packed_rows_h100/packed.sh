#!/usr/bin/env bash
# The reference target's dflash_swa_small trained on packed 32K rows (data.pack_length): every conversation after the
# first in a row has the earlier ones as context, so the drafter sees the target's features from behind long prompts.
# Then block and re-drafted tree on MT-Bench and held out at prefill 0, and both swept behind 32K (window / none).
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo
R=/tmp/res12; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
A=(experiment=dflash_swa_small logger=none target.path=/tmp/tgt data.path=/tmp/pf4/sharegpt_prompts.jsonl trainer.progress=false
   data.max_records=4000 trainer.max_steps=3000 trainer.checkpoint_every=250 trainer.eval_every=100000 trainer.loop_eval_prompts=0
   data.pack_length=32768 trainer.batch_size=1 drafter.num_anchors=4096 trainer.pad_multiple=0 output_dir=$R/run)
stamp "packed train start"
python3 -m train "${A[@]}" trainer.time_limit_minutes=${LIMIT:-10} > $R/train.log 2>&1
stamp "train rc=$?"
if [ ! -f $R/run/export/config.json ]; then
  step=$(ls -d $R/run/checkpoints/step_* 2>/dev/null | sed 's/.*step_0*//' | sort -n | tail -1)
  stamp "finishing at step $step"
  python3 -m train "${A[@]}" trainer.max_steps=$step >> $R/train.log 2>&1
fi
stamp "train done"
D=$R/run; H=/tmp/hp/sharegpt_heldout_prompts.jsonl
E="--drafter $D --max-new-tokens 256 --batch-size 16 --no-baseline"
T="--no-pld --tree-topk 32 --tree-tokens 1024 --tree-redraft 4"
sw() {
  local name=$1 bs=$2; shift 2
  python3 -m eval sweep --drafter $D --windows trained none --prefills 0 32000 --num-questions 20 --max-new-tokens 256 \
    --batch-size $bs "$@" --out $R/sweep_$name > $R/sweep_$name.log 2>&1; stamp "sweep $name rc=$?"
}
sw t32_1024_r4 8 $T &
sw block 16 &
(python3 -m eval mtbench $E --out $R/mtbench_block > $R/mtbench_block.log 2>&1; stamp "block mtbench rc=$?"
 python3 -m eval mtbench $E $T --out $R/mtbench_t32_1024_r4 > $R/mtbench_t32_1024_r4.log 2>&1; stamp "tree mtbench rc=$?") &
(python3 -m eval prompts --prompts $H $E --out $R/heldout_block > $R/heldout_block.log 2>&1; stamp "block heldout rc=$?"
 python3 -m eval prompts --prompts $H $E $T --out $R/heldout_t32_1024_r4 > $R/heldout_t32_1024_r4.log 2>&1; stamp "tree heldout rc=$?") &
wait
stamp "all done"; touch $R/DONE
