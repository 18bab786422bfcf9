#!/bin/bash
# call 2: the forced count a cached constant (one verify graph per run, not per generation); the run-ahead tests on the GPU
# (graph counts checked), then DFlash's whole block at 8K alternating this tree / HEAD (1043b36), then 1K and 32K (this tree)
R=$OUT; export PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r $(ls -A | grep -vE '^(\.target|\.whl|\.git)$') /tmp/old/ && cp -r .whl/old/* /tmp/old/
timeout 100 python -m pytest -v -p no:cacheprovider -o addopts="" -n 2 tests/test_static_target.py tests/test_static_drafters.py \
  -k "borrowed or end_where" > $R/tests.txt 2>&1
echo "tests rc=$?"; grep -E "FAILED|ERROR|passed|failed" $R/tests.txt | cut -c1-200 | tail -5
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash"
for run in new1 old1 new2 old2 new1k new32k; do
  c=8192; [[ $run == new1k ]] && c=1024; [[ $run == new32k ]] && c=32768
  if [[ $run == old* ]]; then d=/tmp/old; else d=$PWD; fi
  (cd $d && timeout 100 python $CMD --contexts $c > $R/d_$run.txt 2>&1); echo "$run $c rc=$?"
  grep -E "^static|^dflash" $R/d_$run.txt | cut -c1-150
done
