#!/bin/bash
# Call B: issue 25's "the 8B-shape MFU must not drop" for EAGLE-3's step compiled whole (trainer.compile_scope=step, the
# default since 439a3c0) against compile_scope=regions (EAGLE-3 eager: the path of the earlier 8B measurements), one
# process each, one after the other. Setup: setup.sh.
set -u
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
R=/tmp/resB; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/resB.tgz -C $R .' EXIT
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
echo "tree $(cat .dev/tree.txt 2>/dev/null)" > $R/tree.txt; stamp start
for v in "step" "regions"; do
  set -- $v; name=step8b_eagle3_$1${2:+_cg}
  timeout 170 python3 benchmarks/train_step.py trainer.compile_scope=$v --shape qwen3-8b --drafter eagle3 --seq 3072 --windows 2048 \
    > $R/$name.txt 2>&1; stamp "$name rc=$?"; tail -4 $R/$name.txt
done
cat $R/times.txt
