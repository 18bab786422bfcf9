#!/bin/bash
# call B: the 8B-shape DFlash step (3072 tokens, W=2048): FA4 as custom ops, flex, and FA4 in the tree before the custom ops (91a03f6)
set -u
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 SWA_REFERENCE_TARGET=/tmp/tgt
R=/tmp/res2; rm -rf $R; mkdir -p $R; trap 'tar czf $OUT/res2.tgz -C $R .' EXIT
rm -rf /tmp/b91 && mkdir -p /tmp/b91 && tar xzf /tmp/g/b91.tgz -C /tmp/b91
S="--shape qwen3-8b --drafter dflash --seq 3072 --windows 2048"
date +%T > $R/times.txt
timeout 170 python3 benchmarks/train_step.py $S > $R/step8b_fa4.txt 2>&1; echo "fa4 rc=$? $(date +%T)" >> $R/times.txt
timeout 150 python3 benchmarks/train_step.py --backend flex $S > $R/step8b_flex.txt 2>&1; echo "flex rc=$? $(date +%T)" >> $R/times.txt
(cd /tmp/b91 && timeout 170 python3 benchmarks/train_step.py $S > $R/step8b_fa4_91a03f6.txt 2>&1); echo "b91 rc=$? $(date +%T)" >> $R/times.txt
tail -4 $R/step8b_*.txt
