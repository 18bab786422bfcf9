#!/usr/bin/env bash
# the quickstart's drafter trained plainly and with revealed slots: block, tree, re-drafted tree; MT-Bench's 80 questions
cd /work/main && . /work/venv/bin/activate
for d in plain reveal; do
  E="--drafter /tmp/qs/$d --max-new-tokens 64 --batch-size 8 --no-baseline"
  python -m eval mtbench $E --out /tmp/qs/ev_${d}_block > /tmp/qs/ev_${d}_block.log 2>&1
  python -m eval mtbench $E --no-pld --tree-topk 8 --tree-tokens 64 --out /tmp/qs/ev_${d}_t8_64 > /tmp/qs/ev_${d}_t8_64.log 2>&1
  python -m eval mtbench $E --no-pld --tree-topk 8 --tree-tokens 64 --tree-redraft 2 --out /tmp/qs/ev_${d}_t8_64_r2 > /tmp/qs/ev_${d}_t8_64_r2.log 2>&1
done
echo done > /tmp/qs/EVAL_DONE
