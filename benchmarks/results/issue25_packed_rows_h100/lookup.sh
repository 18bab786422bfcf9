#!/usr/bin/env bash
# The packed-row drafter with prompt lookup's chain as one more branch of its re-drafted tree, MT-Bench and held out.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo
R=/tmp/res13; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
E="--target /tmp/tgt --drafter /tmp/pk/export_dflash --max-new-tokens 256 --batch-size 16 --no-baseline --no-pld --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --tree-lookup 15"
(python3 -m eval mtbench $E --out $R/mtbench_t32_1024_r4_l15 > $R/mtbench.log 2>&1; stamp "mtbench rc=$?") &
(python3 -m eval prompts --prompts /tmp/hp/sharegpt_heldout_prompts.jsonl $E --out $R/heldout_t32_1024_r4_l15 > $R/heldout.log 2>&1; stamp "heldout rc=$?") &
wait; touch $R/DONE
