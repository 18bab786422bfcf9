#!/usr/bin/env bash
# SmolLM2: the reveal-trained DFlash drafter (/tmp/dr), larger re-drafted trees on MT-Bench, prompt lookup beside
# (15 drafts) from the first evaluation, which runs without --no-pld; four evaluations at once.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SWA_DRAFTERS_CACHE=/tmp/swacache
cd /tmp/repo
R=/tmp/res10/smol; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
T=builtin:smollm2-135m-instruct; H=/tmp/hp/sharegpt_heldout_prompts.jsonl; D=/tmp/dr
while [ ! -f /tmp/CONVERTED ]; do sleep 2; done
E="--target $T --drafter $D --max-new-tokens 256 --batch-size 16 --no-baseline"
m() { local name=$1; shift; python3 -m eval mtbench $E "$@" --out $R/mtbench_$name > $R/mtbench_$name.log 2>&1; stamp "mtbench $name rc=$?"; }
h() { local name=$1; shift; python3 -m eval prompts --prompts $H $E "$@" --out $R/heldout_$name > $R/heldout_$name.log 2>&1; stamp "heldout $name rc=$?"; }
stamp "evals start"
m t24_768_r3 --tree-topk 24 --tree-tokens 768 --tree-redraft 3 &
m t32_1024_r3 --tree-topk 32 --tree-tokens 1024 --tree-redraft 3 --no-pld &
m t24_768_r4 --tree-topk 24 --tree-tokens 768 --tree-redraft 4 --no-pld &
h t24_768_r3 --tree-topk 24 --tree-tokens 768 --tree-redraft 3 &
wait
stamp "round 1 done"
m t32_1024_r4 --tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --no-pld &
h t32_1024_r3 --tree-topk 32 --tree-tokens 1024 --tree-redraft 3 --no-pld &
m block &
wait
stamp "evals done"
touch $R/DONE
