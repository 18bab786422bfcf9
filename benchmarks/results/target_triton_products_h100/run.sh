#!/usr/bin/env bash
# Session 18, call 3: the target's few-row products through the Triton kernel (StaticTarget triton_products)
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res; rm -rf $R; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
stamp start
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
cd /tmp/repo
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 3 --target-products cublas triton"
python benchmarks/decode_speed.py $A --contexts 1024 32768 --out $R/target1.json > $R/target1.txt 2>&1; stamp "target1 rc=$?"
python benchmarks/decode_speed.py $A --contexts 1024 --out $R/target2.json > $R/target2.txt 2>&1; stamp "target2 rc=$?"
python -m pytest -q -o addopts="" -p no:cacheprovider tests/test_static_target.py tests/test_static_drafters.py tests/test_skinny_gemm.py -k "triton or cuda or gpu or bf16" --deselect "tests/test_static_drafters.py::test_steps_end_where_the_target_alone_ends[cuda]" > $R/gpu_tests.txt 2>&1
stamp "tests rc=$?"
touch $R/done
