#!/bin/bash
# As run on the device (no network), from wheels carried in pieces. The wheels (pip download on a machine with the
# registry: pip download 'flash-attn-4[cu13]==4.0.0b36' 'nvidia-cutlass-dsl[cu13]==4.8.1' --python-version 3.12
# --only-binary=:all: --platform manylinux_2_28_x86_64, then keep these):
#   flash_attn_4-4.0.0b36, nvidia_cutlass_dsl-4.8.1 (a .pth only), nvidia_cutlass_dsl_libs_base-4.8.1,
#   nvidia_cutlass_dsl_libs_core-4.8.1 (cutlass/ and cutlass/cute/ Python sources: the piece earlier sessions missed),
#   nvidia_cutlass_dsl_libs_cu13-4.8.1 (92 MB; carried unpacked as cu13.tar.xz, 63.5 MB, in four 16 MiB pieces),
#   quack_kernels-0.6.5, apache_tvm_ffi-0.1.15.post2, torch_c_dlpack_ext-0.1.5, einops-0.8.2,
#   and cuda-bindings / cuda-pathfinder / protobuf / typing_extensions where the image lacks them.
# PYTHONPATH then needs /tmp/site/nvidia_cutlass_dsl/dsl_packages too (the .pth is not read from a --target folder).
# call 5: FlashAttention-4 + cutlass DSL (libs-core was the missing piece) + hydra wheels into /tmp/site
set -u
S=/tmp/stage; mkdir -p $S /tmp/site; cp .dev/fa5/* $S/
cat $S/cu13.part00 $S/cu13.part01 $S/cu13.part02 $S/cu13.part03 > $S/cu13.tar.xz
echo "sha ok? $(sha256sum $S/cu13.tar.xz | awk '{print $1}') vs $(cat $S/cu13.sha256)"
python3 - <<'PY'
import importlib.metadata as m
for d in ["cuda-bindings", "cuda-pathfinder", "protobuf", "typing_extensions", "einops", "apache-tvm-ffi", "torch-c-dlpack-ext", "quack-kernels", "torch", "triton"]:
    try: print("image has", d, m.version(d))
    except m.PackageNotFoundError: print("image lacks", d)
PY
W=""
for f in $S/*.whl; do
  b=$(basename $f)
  case $b in cuda_bindings*|cuda_pathfinder*|typing_extensions*|protobuf*)
    n=$(echo $b | cut -d- -f1 | tr _ -); python3 -c "import importlib.metadata as m; m.version('$n')" 2>/dev/null && { echo "skip $b (image has it)"; continue; };;
  esac
  W="$W $f"
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W 2>&1 | tail -3
python3 -c "import tarfile; tarfile.open('$S/cu13.tar.xz').extractall('/tmp/site')"
ls /tmp/site | head -40
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
python3 -c "import cutlass.cute, flash_attn.cute.interface; from kernels import fa4_adapter as a; print(a.installed_version(), a.check(), a.available())" 2>&1 | tail -3
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
