#!/usr/bin/env bash
# The fresh-fraction drafter (res13) on all 80 MT-Bench questions, prefill 0 and 32K, trained window: the tree + lookup 15
# (no prompt lookup cells) beside the block (with prompt lookup's cells), two sweeps at once on one GPU. Prefill 31,000,
# not 32,000: MT-Bench question 105's second turn (544 prompt tokens) + 256 new tokens behind 32,000 exceeds the target's
# 32,768 positions (the sweep stops with that error), so the prompts here are 31,028-31,773 tokens and the contexts reach 32,029
# (the 20-question sweeps at 32,000: prompts of 32,039-32,434).
# Then --window none for the same drafter (stopped by the device budget after 37 of the 80 questions at 31,000):
#   python3 -m eval sweep --target /tmp/tgt --drafter /tmp/g14/fresh/export_dflash --windows none --prefills 0 31000 --num-questions 80 --max-new-tokens 256 --batch-size 8 --no-pld --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --tree-lookup 15 --out $R/sweep80_l15_none
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo
R=/tmp/res14; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
SW="--target /tmp/tgt --drafter /tmp/g14/fresh/export_dflash --windows trained --prefills 0 32000 --num-questions 80 --max-new-tokens 256"
stamp start
(python3 -m eval sweep $SW --batch-size 8 --no-pld --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --tree-lookup 15 --out $R/sweep80_l15 > $R/sweep80_l15.log 2>&1; stamp "l15 rc=$?") &
(python3 -m eval sweep $SW --batch-size 16 --out $R/sweep80_block > $R/sweep80_block.log 2>&1; stamp "block rc=$?") &
wait; stamp "all done"; touch $R/DONE
