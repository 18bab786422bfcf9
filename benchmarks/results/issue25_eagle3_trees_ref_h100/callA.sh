#!/bin/bash
# call A: wheels, the reference target, the prompts; regenerate 5,000 4-turn ShareGPT conversations with the target and
# train eagle3_swa_small on them, its training cut to end inside the call (callB resumes it to the end)
T0=$(date +%s); export PYTHONUNBUFFERED=1; E=.gl/e3b
[ -d /tmp/site/hydra ] || { echo "machine is fresh: run e3a/setup.sh first"; exit 3; }
[ -d /tmp/tgt/qwen3-27m-sharegpt ] || { cat /tmp/tgt_part_aa .gl/e3b/tgt_part_ab .gl/e3b/tgt_part_ac .gl/e3b/tgt_part_ad > /tmp/tgt.tar.xz && python3 -c "import tarfile; tarfile.open('/tmp/tgt.tar.xz').extractall('/tmp/tgt')"; }
mkdir -p /tmp/e3
export PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache
W=/tmp/e3; stamp() { echo "$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a $W/times.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt; git log -1 --format=%h 2>/dev/null > $W/tree.txt; cat $E/tree.txt >> $W/tree.txt 2>/dev/null
A=(experiment=eagle3_swa_small logger=none target.path=/tmp/tgt/qwen3-27m-sharegpt data.path=/tmp/pf/p5000.jsonl data.max_records=5000
   trainer.max_steps=2500 trainer.checkpoint_every=250 trainer.eval_every=100000 trainer.loop_eval_prompts=0 trainer.progress=false output_dir=$W/run)
stamp "regenerate start"
python3 -m train "${A[@]}" trainer.max_steps=1 trainer.export=false trainer.eval_every=0 trainer.checkpoint_every=0 output_dir=$W/regen_run > $W/regen.log 2>&1
stamp "regenerate rc=$? $(grep -o 'regenerated [0-9]* turns' $W/regen.log)"
left=$(( 560 - ($(date +%s) - T0) ))
lim=$(python3 -c "print(round(max(0.5, ($left - 75) / 60), 2))")
stamp "train start (time limit $lim min)"
python3 -m train "${A[@]}" trainer.time_limit_minutes=$lim > $W/train.log 2>&1
stamp "train rc=$? $(ls -d $W/run/checkpoints/step_* 2>/dev/null | tail -1)"
grep -E "drafter:|step [0-9]+:|done|stopping" $W/train.log | tail -5
cd $W && tar czf $OUT/callA.tgz times.txt gpu.txt tree.txt regen.log train.log run/metrics.jsonl 2>/dev/null; ls -la $OUT
