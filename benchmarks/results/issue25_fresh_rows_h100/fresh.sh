#!/usr/bin/env bash
# Does data.pack_fresh_fraction=0.5 keep packing's 32K retention without its prefill-0 cost? (run 2026-11-27, one H100)
# experiment=dflash_swa_small_long data.pack_fresh_fraction=0.5, 3,000 steps (as results/issue25_packed_rows_h100, which is
# the fraction-0 run; results/issue25_lookup_trees_h100 is the unpacked recipe), then MT-Bench / held out for the block,
# the tree 32/1024 r4 and the tree + lookup 15, and the 32K sweeps of the block (batch 16) and the tree + lookup (batch 8),
# windows trained and none, 20 questions (the same as the two earlier runs: compare with benchmarks/sweep_kept_ci.py --against).
# Device: wheels in /tmp/site, the repo in /tmp/repo, the reference target in /tmp/tgt, the 4-turn ShareGPT prompts in /tmp/pf4
# and the held-out prompts in /tmp/hp (as packed.sh). Afterwards the tree's 32K sweep alone (trained window):
#   python3 -m eval sweep --drafter $R/run --windows trained --prefills 0 32000 --num-questions 20 --max-new-tokens 256 --batch-size 8 \
#     --no-pld --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --out $R/sweep_tree
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo
R=/tmp/res13; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
A=(experiment=dflash_swa_small_long data.pack_fresh_fraction=${FRESH:-0.5} logger=none target.path=/tmp/tgt data.path=/tmp/pf4/sharegpt_prompts.jsonl
   trainer.progress=false data.max_records=4000 trainer.max_steps=3000 trainer.checkpoint_every=250 trainer.eval_every=100000
   trainer.loop_eval_prompts=0 output_dir=$R/run)
stamp "train start"
python3 -m train "${A[@]}" trainer.time_limit_minutes=${LIMIT:-10} > $R/train.log 2>&1
stamp "train rc=$?"
if [ ! -f $R/run/export/config.json ]; then
  step=$(ls -d $R/run/checkpoints/step_* 2>/dev/null | sed 's/.*step_0*//' | sort -n | tail -1)
  stamp "finishing at step $step"; python3 -m train "${A[@]}" trainer.max_steps=$step >> $R/train.log 2>&1
fi
D=$R/run; H=/tmp/hp/sharegpt_heldout_prompts.jsonl
E="--drafter $D --max-new-tokens 256 --batch-size 16 --no-baseline"
T="--no-pld --tree-topk 32 --tree-tokens 1024 --tree-redraft 4"
SW="--drafter $D --windows trained none --prefills 0 32000 --num-questions 20 --max-new-tokens 256"
(python3 -m eval sweep $SW --batch-size 8 $T --tree-lookup 15 --out $R/sweep_t32_1024_r4_l15 > $R/sweep_l15.log 2>&1; stamp "sweep l15 rc=$?") &
(python3 -m eval sweep $SW --batch-size 16 --out $R/sweep_block > $R/sweep_block.log 2>&1; stamp "sweep block rc=$?") &
(python3 -m eval mtbench $E --out $R/mtbench_block > /dev/null 2>&1; python3 -m eval mtbench $E $T --tree-lookup 15 --out $R/mtbench_l15 > /dev/null 2>&1
 python3 -m eval mtbench $E $T --out $R/mtbench_tree > /dev/null 2>&1; stamp "mtbench done") &
(python3 -m eval prompts --prompts $H $E --out $R/heldout_block > /dev/null 2>&1; python3 -m eval prompts --prompts $H $E $T --tree-lookup 15 --out $R/heldout_l15 > /dev/null 2>&1
 python3 -m eval prompts --prompts $H $E $T --out $R/heldout_tree > /dev/null 2>&1; stamp "heldout done") &
wait; stamp "all done"; touch $R/DONE
