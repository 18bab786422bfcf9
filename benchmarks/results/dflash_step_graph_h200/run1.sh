#!/bin/bash
# call 1: the step's drafting as one graph (append_and_draft, borrowed buffers): GPU tests first, then one DFlash step at 8K
# event by event, then DFlash's whole block at 8K, this tree and HEAD's (1043b36) alternating, a process each
R=$OUT; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site SWA_REFERENCE_TARGET=$PWD/.target/qwen3-27m-sharegpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r $(ls -A | grep -vE '^(\.target|\.whl|\.git)$') /tmp/old/ && cp -r .whl/old/* /tmp/old/
timeout 200 python -m pytest -v -p no:cacheprovider -o addopts="" -n 3 tests/test_static_target.py tests/test_static_drafters.py \
  -k "borrowed or end_where or captured or cuda or gpu" > $R/tests.txt 2>&1
echo "tests rc=$?"; grep -E "FAILED|ERROR|passed|failed" $R/tests.txt | cut -c1-200 | tail -8
timeout 120 python benchmarks/profile_decode_loop.py --context 8192 --drafter dflash --tau 3 --tokens 96 \
  --step-timeline $R/step8k_new.txt > $R/prof8k_new.txt 2>&1; echo "prof rc=$?"; head -1 $R/step8k_new.txt
CMD="benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --contexts 8192"
for run in new1 old1; do
  if [[ $run == old* ]]; then d=/tmp/old; else d=$PWD; fi
  (cd $d && timeout 100 python $CMD > $R/d8k_$run.txt 2>&1); echo "$run rc=$?"
  grep -E "^static|^dflash" $R/d8k_$run.txt | cut -c1-150
done
