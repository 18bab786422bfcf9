#!/bin/bash
# on the device, in its own process session (2026-12-06, tenth session): SmolLM2's EAGLE-3 with TWO decoder layers on
# best-fit packed rows, as many optimizer steps as the lease leaves, the cosine schedule run to its end.
#  1. side by side: R regenerates RECORDS (15,000) ShareGPT conversations with SmolLM2 (data.prepare_only=true), the file
#     packed for the way back (xz, pieces) as soon as it is written;
#     P compiles the training step on the builtin ShareGPT sample (same row shapes: 16 x 2048 packed) and times 40 steps,
#     saving trainer.compile_cache, so the real run starts warm
#  2. STEPS = (TRAIN_END - now - 100 s) / P's step time (x 1.08 margin); the real run loads the compile cache
#  3. the trees (EAGLE-3: 1,024 nodes at depth 24) on MT-Bench and the held-out prompts, prompt lookup beside them
# EXTRA (train overrides), EVAL_EXTRA and MIN_STEPS: for a CPU rehearsal (the README's command). KIND=dflash trains
# DFlash instead (below)
set -u
W=/tmp/sm; cd /tmp/repo_snapshot
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site SWA_DRAFTERS_CACHE=/tmp/swacache
stamp() { echo "$(date +%H:%M:%S) $(date +%s) $*" >> $W/times.txt; }
# the file this pipeline regenerates: newer than its start, so a cache an earlier run on the same machine left (a second
# pipeline on a warm lease, a CPU rehearsal) is not packed and returned in its place
mkdir -p $W && touch $W/.started
regen_path() { find /tmp/swacache/data/regenerated -maxdepth 1 -name '*.jsonl' -newer $W/.started 2>/dev/null | grep -v partial | head -1; }
pack_regen() {  # the regenerated file (not a .partial one) xz-compressed in pieces under 16 MiB, to return from the lease
  ( mkdir -p $W/ret && cd $W/ret && f=$(regen_path) && cp $f regen.jsonl && \
    xz -T8 -6 regen.jsonl && split -b 15000000 -d regen.jsonl.xz regen.jsonl.xz.part && rm regen.jsonl.xz && \
    sha256sum $f > regen.sha256 && stamp "regen file packed: $(ls -la | tr '\n' ' ')" )
}
# KIND: eagle3 (default: two layers on packed rows) or dflash (dflash_swa_small as its best SmolLM2 drafter was trained:
# five sliding layers, revealed slots, one conversation a row; its trees re-drafted, 32/1024, depths 1-3)
KIND=${KIND:-eagle3}
COMMON="logger=none target.path=builtin:smollm2-135m-instruct data.num_eval=0 trainer.eval_every=0 trainer.loop_eval_prompts=0
   trainer.progress=false"
if [ "$KIND" = dflash ]; then
  C="experiment=dflash_swa_small $COMMON ${EXTRA:-}"
  TREE="--tree-topk 32 --tree-tokens 1024 --tree-redraft 3"
else
  C="experiment=eagle3_swa_small $COMMON
   drafter.draft_vocab_size=16384 drafter.num_hidden_layers=2 drafter.layer_types=[sliding_attention,sliding_attention]
   data.pack_documents=true data.pack_length=2048 trainer.attention_backend=flex ${EXTRA:-}"
  # 1,024 nodes at depth 24: the fourteenth session's drafter decoded τ 6.199 / 7.531 with them on the H100, against
  # 5.799 / 6.699 with 384 nodes at depth 16 (sixteenth session); the evaluation takes ~280 s instead of ~120 s
  TREE="--tree-topk 16 --tree-tokens 1024 --draft-steps 24"
fi
# TREE_FLAGS: the trees' flags instead of the kind's default; TREE2_FLAGS: a second tree decoded beside it, into
# eval_{mtbench,prompts}_${KIND}_tree2 (none by default)
TREE=${TREE_FLAGS:-$TREE}
REAL="data.path=/tmp/pf/sharegpt_prompts.jsonl data.max_records=${RECORDS:-15000}"
# REGEN_FILE: a regenerated file an earlier lease returned (carry_regen.sh puts it in place): trained on as it is, the
# "regeneration" process below then only tokenizes and packs it beside the probe
[ -n "${REGEN_FILE:-}" ] && REAL="data.path=$REGEN_FILE data.regenerate.enabled=false data.max_records=null"
# (the regeneration split over processes, EXTRA=data.regenerate.processes=N, does not pay on one GPU: 4 processes ran at
# 0.92x one process's tokens/s on an H100, the GPU 100% busy, fifteenth session; the SHARDS=N of the fourteenth went)
stamp "start (train end at $TRAIN_END)"
( python3 -m train $C $REAL data.prepare_only=true output_dir=$W/regen > $W/regen.log 2>&1; stamp "regen end rc=$?" ) &
# the regenerated file packed for the way back as soon as it is written (prepare_only goes on to tokenize and pack it),
# so that a progress call can return it while the training runs; stops waiting when the regeneration ends without one
regen_file() { local f; f=$(regen_path 2>/dev/null) && [ -n "$f" ] && [ -f "$f" ]; }
( until regen_file; do grep -q "regen end" $W/times.txt && break; sleep 3; done; regen_file && [ -z "${REGEN_FILE:-}" ] && pack_regen ) &
PACKER=$!
# the GPU's utilisation and memory every 10 s until the regeneration ends (gpu_util.log, in the logs' archive): how busy
# the regeneration keeps the GPU (no nvidia-smi, as in a CPU rehearsal: the file stays empty)
( until grep -q "regen end" $W/times.txt; do
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | sed "s/^/$(date +%H:%M:%S) /" >> $W/gpu_util.log
    sleep 10; done ) &
[ -z "${REGEN_ONLY:-}" ] && ( python3 -m train $C data.path=builtin:sharegpt-sample data.max_records=null data.regenerate.enabled=false trainer.max_steps=40 \
    trainer.export=false trainer.checkpoint_every=0 trainer.compile_cache=$W/cc.bin output_dir=$W/probe > $W/probe.log 2>&1
  stamp "probe end rc=$?" ) &
if [ -n "${REGEN_ONLY:-}" ]; then  # a short lease: the regenerated file returned for a later one, once written
  wait $PACKER; stamp "all done"; exit 0
fi
wait
# STEP_S given (seconds a step took alone on an earlier lease: 0.2506 for the two-layer EAGLE-3 on an H100, fourteenth
# session) is used as it is: the probe's own timing runs beside the regeneration, whose processes share the GPU (the
# thirteenth session's probe ran at 0.65x its speed alone), and would buy fewer steps than the lease holds
PROBE_S=$(python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("/tmp/sm/probe/metrics.jsonl") if '"train/tokens_per_s"' in l]
a, b = rows[-2], rows[-1]   # steps 30 and 40: the window's wall time = its tokens / its tokens per second
print(f"{(b['train/tokens'] - a['train/tokens']) / b['train/tokens_per_s'] / (b['step'] - a['step']):.4f}")
PY
)
STEP_S=${STEP_S:-${PROBE_S:-0.35}}  # neither given nor timed (the probe failed): a guess, logged
STEPS=$(python3 -c "print(max(${MIN_STEPS:-300}, min(${MAX_STEPS:-1100}, int(($TRAIN_END - $(date +%s) - 100) / ($STEP_S * 1.08)))))")
stamp "probe step ${PROBE_S:-none}s, step time used ${STEP_S}s -> $STEPS steps"
# a safety net: the probe times the step on the sample's rows, whose lengths DFlash's unpacked rows do not share (its
# real step is slower), so the run also stops near TRAIN_END (trainer.time_limit_minutes: a checkpoint, no export) and
# its newest checkpoint is exported for the trees; the schedule is then cut short, which times.txt says. The limit counts
# from the first step: BUILD_S (the target's load, the cached rows, the compile cache: ~35 s on the H100) comes first.
LIMIT_MIN=$(python3 -c "print(round(max(1.0, ($TRAIN_END - $(date +%s) - ${BUILD_S:-45}) / 60), 2))")
python3 -m train $C $REAL trainer.max_steps=$STEPS trainer.checkpoint_every=500 trainer.compile_cache=$W/cc.bin \
  trainer.time_limit_minutes=$LIMIT_MIN output_dir=$W/run > $W/train.log 2>&1
TRAIN_RC=$?
stamp "train end rc=$TRAIN_RC"
if [ ! -f $W/run/export/config.json ] && ls -d $W/run/checkpoints/step_* > /dev/null 2>&1; then
  why="the run failed (rc $TRAIN_RC)"; grep -q "(trainer.time_limit_minutes)" $W/train.log && why="stopped by the time limit"
  python3 -m train.export $W/run $W/export_of_checkpoint --format $([ $KIND = dflash ] && echo dflash || echo speculators) \
    --target builtin:smollm2-135m-instruct >> $W/train.log 2>&1 && mv $W/export_of_checkpoint $W/run/export  # (not into the source)
  stamp "$why: its newest checkpoint exported for the trees rc=$? ($(ls -d $W/run/checkpoints/step_* | tail -1))"
fi
evaluate() {  # evaluate NAME FLAGS...: MT-Bench and the held-out prompts, each in its own process (the caller waits),
  # into eval_{mtbench,prompts}_NAME
  local name=$1; shift
  for set in mtbench prompts; do
    local extra=""; [ $set = prompts ] && extra="--prompts /tmp/pf/sharegpt_heldout_prompts.jsonl"
    ( python3 -m eval $set $extra --target builtin:smollm2-135m-instruct --max-new-tokens 256 --batch-size 16 --no-baseline \
        "$@" --out $W/eval_${set}_$name > $W/eval_${set}_$name.log 2>&1
      stamp "eval $set ($name) rc=$?" ) &
  done
}
evaluate $KIND --drafter $W/run/export $TREE ${EVAL_EXTRA:-}
[ -n "${TREE2_FLAGS:-}" ] && evaluate ${KIND}_tree2 --drafter $W/run/export $TREE2_FLAGS ${EVAL_EXTRA:-}
# prompt lookup alone with PLD_DEEP drafts a step (default 32; 0: none) on the same prompts, beside the trees (it needs
# no drafter; side by side they took 166 s on the H100 where one after the other takes ~3 min, fifteenth session): the
# trees' evaluations run it with as many drafts as they are deep (16, or 15 for DFlash), and a deeper one is the stricter
# baseline (on the CPU 32 drafts gave SmolLM2's prompt lookup +3.0% under vLLM's count: fourteenth session)
# PLD_EXTRA: its own extra flags (default EVAL_EXTRA; a rehearsal whose EVAL_EXTRA holds tree flags sets it)
[ "${PLD_DEEP:-32}" -gt 0 ] && evaluate pld${PLD_DEEP:-32} --drafter pld --draft-steps ${PLD_DEEP:-32} ${PLD_EXTRA:-${EVAL_EXTRA:-}}
wait
# the seventeenth session's fix checked on this GPU, after everything else (~20 s): prefill waves at regeneration's
# shapes with cuDNN left out (ours, the default since) against torch's own choice, one shape and a new length each
# (profile_prefill_rows.py; BENCHMARKS.md "2026-12-07, seventeenth session"); PREFILL_CHECK=0 skips it
if [ "${PREFILL_CHECK:-1}" = 1 ] && nvidia-smi > /dev/null 2>&1; then
  python3 benchmarks/profile_prefill_rows.py --device cuda --backends ours torch --repeats 3 --cases 6x650@0 16x200@1000 \
    --trace > $W/prefill_check.log 2>&1
  stamp "prefill check rc=$?"
fi
stamp "all done"
