#!/bin/bash
# Setup on a fresh device machine in three calls (a call carries 64 MiB with the working tree; benchmarks/results moved
# aside for these calls, so the tree is ~16 MiB): FlashAttention-4 4.0.0b36 + CuTe DSL 4.8.1 (libs-cu13 as an xz tar in
# two pieces), hydra/omegaconf/datasets wheels, the reference target in shards, sg_train_600.jsonl and git archive 54207b2.
#   call 1: bash setup.sh 1   (carry .dev/s1: cu13.part00)
#   call 2: bash setup.sh 2   (carry .dev/s2: cu13.part01, the wheels, target shard 1)
#   call 3: bash setup.sh 3   (carry .dev/s3: target shards 2-4 and files, data, old tree)
set -u
S=/tmp/stage; mkdir -p $S /tmp/site /tmp/tgt
case $1 in
1) cp .dev/s1/* $S/ ;;
2) cp .dev/s2/* $S/
   cat $S/cu13.part00 $S/cu13.part01 > $S/cu13.tar.xz
   echo "sha $(sha256sum $S/cu13.tar.xz | cut -c1-16) want $(cut -c1-16 $S/cu13.sha256)"
   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $S/*.whl 2>&1 | tail -3
   python3 -c "import tarfile; tarfile.open('$S/cu13.tar.xz').extractall('/tmp/site')"
   mv $S/model-00001-of-00004.safetensors /tmp/tgt/ ;;
3) cp .dev/s3/tgt/* /tmp/tgt/; cp .dev/s3/sg_train_600.jsonl /tmp/
   rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf .dev/s3/old54207b2.tgz -C /tmp/old && cp benchmarks/train_throughput.py /tmp/old/benchmarks/
   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
   python3 -c "import hydra, omegaconf, datasets; from kernels import fa4_adapter as a; print('fa4', a.installed_version(), a.check(), a.available())" 2>&1 | tail -2
   ls /tmp/tgt; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv ;;
esac
ls $S | head -30
