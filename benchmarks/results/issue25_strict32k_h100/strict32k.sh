#!/usr/bin/env bash
# Issue 25's 32K goal under the stricter reading: every prompt >= 32,000 tokens. The fresh-fraction drafter (the one in
# benchmarks/results/issue25_fresh_rows_h100, export in .dev/g14/fresh/export_dflash) on all 80 MT-Bench questions behind
# 31,979 filler tokens with 128 new tokens a turn (the most that fits every question: eval's check_context_fits), tree +
# lookup 15 at batch 8, windows trained and none, and the block at batch 16 with prompt lookup's cells.
# Call sequence: (1) carry .dev/w .dev/g14 .dev/g15: install wheels into /tmp/site, copy the repo (git ls-files), cp g14 g15
# to /tmp; (2) carry .dev/tgtA: cp into /tmp/tgt; (3) carry .dev/tgtB: cp, then setsid this script; wait-loop calls (~12 min).
# A first attempt (the session's last 3.5 device minutes) finished the tree + lookup's prefill-0 cell (tau 8.385 at 128 new
# tokens): carry .dev/g15/res/sweep80s_l15 and copy it to $R/sweep80s_l15 first; the sweep resumes from its cells/ file.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo
R=/tmp/res15; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
SW="--target /tmp/tgt --drafter /tmp/g14/fresh/export_dflash --prefills 0 31979 --num-questions 80 --max-new-tokens 128"
T="--no-pld --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --tree-lookup 15"
stamp start
(python3 -m eval sweep $SW --windows trained none --batch-size 8 $T --out $R/sweep80s_l15 > $R/sweep80s_l15.log 2>&1; stamp "l15 rc=$?") &
(python3 -m eval sweep $SW --windows trained --batch-size 16 --out $R/sweep80s_block > $R/sweep80s_block.log 2>&1; stamp "block rc=$?") &
wait; stamp "all done"; touch $R/DONE
