#!/bin/bash
# wait until the regeneration is done and both compile cases have timed their first step, or WAIT seconds from T0
WAIT=$1 T0=${2:-$(date +%s)}
done_all() { grep -q "all done" /tmp/sm/times.txt 2>/dev/null && grep -q "^| 1 " /tmp/cc/chunks8.txt 2>/dev/null && grep -q "^| 1 " /tmp/cc/chunks1.txt 2>/dev/null; }
while ! done_all && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
echo "elapsed $(( $(date +%s) - T0 )) s in this call"
ls /tmp/swacache/data/regenerated/ 2>/dev/null; tr '\r' '\n' < /tmp/sm/regen.log 2>/dev/null | grep -v "^\s*$" | tail -3 | cut -c1-250
cat /tmp/cc/gpu.txt 2>/dev/null; tail -n 3 /tmp/cc/chunks*.txt 2>/dev/null
mkdir -p $OUT/compile; cp /tmp/cc/*.txt $OUT/compile/ 2>/dev/null
bash /tmp/sm/progress.sh 0
