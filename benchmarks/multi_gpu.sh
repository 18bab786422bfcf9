#!/usr/bin/env bash
# Issue 9 on 2 GPUs: a 2-GPU DeepSpeed ZeRO-2 run against a 1-GPU run at the same global batch (loss
# curve, throughput), and resume under DeepSpeed (a 2-GPU run killed by trainer.interrupt_after and
# relaunched == the uninterrupted 2-GPU run). Usage:
#   bash benchmarks/multi_gpu.sh TARGET DATA OUT [STEPS]
set -euo pipefail
TARGET=$1; DATA=$2; OUT=$3; STEPS=${4:-200}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
COMMON="experiment=dflash_swa target.path=$TARGET data.path=$DATA data.num_eval=0 logger=none trainer.progress=false
  trainer.max_steps=$STEPS trainer.num_epochs=null trainer.batch_size=2 trainer.log_every=10 trainer.eval_every=0 trainer.checkpoint_every=0
  trainer.deepspeed=zero2"
mkdir -p "$OUT"
# One process, global batch 4 = micro-batch 2 x accumulation 2.
python -m train $COMMON trainer.grad_accum=2 output_dir=$OUT/gpu1 2>&1 | tail -3
# Two processes, global batch 4 = 2 ranks x micro-batch 2.
torchrun --nproc_per_node 2 --master_port 29631 -m train $COMMON trainer.grad_accum=1 output_dir=$OUT/gpu2 2>&1 | tail -3
# Resume under DeepSpeed: stop near half way, at a logging step (checkpoint), relaunch the same command.
torchrun --nproc_per_node 2 --master_port 29632 -m train $COMMON trainer.grad_accum=1 trainer.interrupt_after=$((STEPS / 20 * 10)) output_dir=$OUT/gpu2_resumed 2>&1 | tail -2
torchrun --nproc_per_node 2 --master_port 29633 -m train $COMMON trainer.grad_accum=1 output_dir=$OUT/gpu2_resumed 2>&1 | tail -2
python benchmarks/compare_runs.py $OUT/gpu1 $OUT/gpu2 --every 2
python benchmarks/compare_runs.py $OUT/gpu2 $OUT/gpu2_resumed --every 4
