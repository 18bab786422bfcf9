#!/usr/bin/env bash
# Session 18, call 2: the loop before this change (HEAD f39e4ef) against it, alternately, in one lease
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res; rm -rf $R; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
stamp start
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
A="--compile --no-eager-baseline --attention split_kv --contexts 1024 --taus 3 --drafters dflash --dflash-draft-steps 0 3"
for i in 1 2; do
  (cd /tmp/old && python benchmarks/decode_speed.py $A --out $R/before$i.json > $R/before$i.txt 2>&1); stamp "before$i rc=$?"
  (cd /tmp/repo && python benchmarks/decode_speed.py $A --dflash-products cublas triton --out $R/now$i.json > $R/now$i.txt 2>&1); stamp "now$i rc=$?"
done
cd /tmp/repo
python -m pytest -q -o addopts="" -p no:cacheprovider tests/test_skinny_gemm.py tests/test_static_drafters.py tests/test_dflash_draft_vocab.py -k "cuda or gpu or triton or bf16" --deselect "tests/test_static_drafters.py::test_steps_end_where_the_target_alone_ends[cuda]" > $R/gpu_tests.txt 2>&1
stamp "tests rc=$?"
python benchmarks/profile_decode_loop.py --dflash-block --draft-tokens 3 --products triton > $R/block.txt 2>&1
stamp "block rc=$?"
touch $R/done
