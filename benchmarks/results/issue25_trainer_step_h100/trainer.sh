#!/usr/bin/env bash
# Issue 25's trainer goal, strict: DFlash tokens/s on the reference target against the code of 54207b2 (the session
# that took the issue), same config (that session's dflash_swa_small: 4 sliding + 1 full, exp slot weights, AdamW, no
# reveal), same rows, same H100. Runs compile in parallel and time one at a time (--serial-timing).
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=/tmp/res16; mkdir -p $R
stamp() { echo "$(date +%H:%M:%S) $*" >> $R/times.txt; }
C="target.path=/tmp/tgt data.path=/tmp/g16/sg_train_600.jsonl data.regenerate.enabled=false data.num_eval=16"
OLD="drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention,sliding_attention,full_attention] drafter.loss_weighting=exp drafter.reveal_prob=0 trainer.optimizer=adamw"
A="--steps 30 --warmup 10"
stamp start
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpu.txt
cd /tmp/repo
python3 benchmarks/probe_flex_dflash.py --variants bwd --masks packed --best-json $R/best_bwd.json > $R/probe_bwd.txt 2>&1; stamp "probe rc=$?"
BWD=$(python3 -c "import json;d=json.load(open('$R/best_bwd.json'));print('{'+', '.join(f'{k}: {v}' for k,v in d.items())+'}')" 2>/dev/null || echo '{}')
stamp "bwd=$BWD"
tp() {  # name code-dir wave-dir runs-in-wave overrides...
  local name=$1 dir=$2 wave=$3 n=$4; shift 4
  (cd $dir && SWA_DRAFTERS_CACHE=/tmp/swacache_$name python3 benchmarks/train_throughput.py experiment=dflash_swa_small $C "$@" $A \
     --serial-timing $wave $n --json $R/$name.json > $R/$name.txt 2>&1; rc=$?; [ $rc != 0 ] && touch $wave/ready.failed_$name; stamp "$name rc=$rc")
}
W=$R/wave1
tp old /tmp/old $W 4 &
tp regions /tmp/repo $W 4 $OLD &
tp step /tmp/repo $W 4 $OLD trainer.compile_scope=step --profile 2 &
tp step_bwd /tmp/repo $W 4 $OLD trainer.compile_scope=step "+trainer.flex_kernel_options=$BWD" &
wait; stamp "wave1 done"
W=$R/wave2
tp step_ro /tmp/repo $W 3 $OLD trainer.compile_scope=step trainer.compile_mode=reduce-overhead &
tp step_ro_bwd /tmp/repo $W 3 $OLD trainer.compile_scope=step trainer.compile_mode=reduce-overhead "+trainer.flex_kernel_options=$BWD" &
tp recipe_step_bwd /tmp/repo $W 3 trainer.compile_scope=step "+trainer.flex_kernel_options=$BWD" &
wait; stamp "wave2 done"
python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py -k "compiled_training_step or flex_training_step" > $R/gpu_tests.txt 2>&1; stamp "gpu tests rc=$?"
touch $R/DONE
