#!/bin/bash
# Setup on a fresh H200 in three calls (stage.sh builds the carries) (benchmarks/results and models/builtin_weights moved aside for these calls, so the
# tree is ~2.4 MB): FlashAttention-4 4.0.0b36 + CuTe DSL 4.8.1 (libs-cu13 as an xz tar in two pieces), hydra, omegaconf,
# datasets wheels, the reference target in shards, sg_train_600.jsonl and git archive 54207b2.
#   call 1: bash .dev/setup.sh 1 (carry .dev/s1)   call 2: ... 2 (carry .dev/s2)   call 3: ... 3 (carry .dev/s3)
set -u
S=/tmp/stage; mkdir -p $S /tmp/site /tmp/tgt
case $1 in
1) cp .dev/s1/*.whl .dev/s1/cu13.* $S/; cp .dev/s1/tgt/* /tmp/tgt/
   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $S/*.whl 2>&1 | tail -3 ;;
2) cp .dev/s2/cu13.* $S/; cp .dev/s2/tgt/* /tmp/tgt/; cp .dev/s2/sg_train_600.jsonl /tmp/
   cat $S/cu13.part00 $S/cu13.part01 > $S/cu13.tar.xz
   echo "sha $(sha256sum $S/cu13.tar.xz | cut -c1-16) want $(cut -c1-16 $S/cu13.sha256)"
   python3 -c "import tarfile; tarfile.open('$S/cu13.tar.xz').extractall('/tmp/site')"
   rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf .dev/s2/old54207b2.tgz -C /tmp/old && cp benchmarks/train_throughput.py /tmp/old/benchmarks/ ;;
3) cp .dev/s3/tgt/* /tmp/tgt/
   for f in .dev/s3/cuda_*.whl; do n=$(basename $f | cut -d- -f1 | tr _ -)
     python3 -c "import importlib.metadata as m; print('image has', '$n', m.version('$n'))" 2>/dev/null || \
       python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $f; done ;;
esac
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
python3 -c "import hydra, omegaconf, datasets; from kernels import fa4_adapter as a; print('fa4', a.installed_version(), a.check(), a.available())" 2>&1 | tail -2
ls /tmp/tgt | tr '\n' ' '; echo; ls $S | tr '\n' ' '; echo
