#!/bin/bash
# On the device: retrain the dflash_swa_small recipe drafter (as in BENCHMARKS "The recipe's DFlash drafter retrained")
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd /tmp/repo
nvidia-smi -L > /tmp/res/gpu.txt
KINDS=dflash SKIP_SWEEP=1 DFLASH_ARGS="trainer.max_steps=3000 trainer.eval_every=100000 trainer.loop_eval_prompts=0" \
  bash benchmarks/small_target_pipeline.sh /tmp/target /tmp/data/p4000.jsonl /tmp/data/heldout.jsonl /tmp/res 32000 -- data.max_records=4000
mkdir -p /tmp/pieces && cd /tmp/res/run_dflash && tar cf /tmp/export.tar export && split -b 15M /tmp/export.tar /tmp/pieces/export.tar.
sha256sum /tmp/export.tar > /tmp/pieces/export.sha256
touch /tmp/res/ALLDONE
