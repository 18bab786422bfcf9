#!/bin/bash
# wait until the regeneration is done and the compile cases have ended, or WAIT seconds from T0
WAIT=$1 T0=${2:-$(date +%s)}
# (a compile case has ended once its table row or its error is written, or no case's process is left)
ended() { grep -qE "^\| 1 |^error:" /tmp/cc/$1.txt 2>/dev/null; }
compiled() { ! pgrep -f "eagle3_step_compile.py" > /dev/null || { ended flex8 && ended flex1 && ended sdpa1 && ended flex1u; }; }
done_all() { grep -q "all done" /tmp/sm/times.txt 2>/dev/null && compiled; }
while ! done_all && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
echo "elapsed $(( $(date +%s) - T0 )) s in this call"
ls /tmp/swacache/data/regenerated/ 2>/dev/null; tr '\r' '\n' < /tmp/sm/regen.log 2>/dev/null | grep -v "^\s*$" | tail -3 | cut -c1-250
cat /tmp/cc/gpu.txt 2>/dev/null; tail -n 3 /tmp/cc/flex8.txt /tmp/cc/flex1.txt /tmp/cc/sdpa1.txt /tmp/cc/flex1u.txt 2>/dev/null
tar czf $OUT/compile.tgz -C /tmp/cc . 2>/dev/null  # one file: a call returns at most 8
bash /tmp/sm/progress.sh 0
