#!/bin/bash
# the last call: the cutlass DSL's cu13 libraries carried as an xz tar in four pieces (.gl/fa0-3, one call each, the tree
# leaving ~18 MB a call), FA4 and its small dependencies as wheels (.gl/w; cuda-bindings from .gl/cb where the image
# lacks it) into /tmp/site, then the benchmark
set -u
S=/tmp/stage; mkdir -p $S /tmp/site
cat .gl/fa0/cu13.part00 .gl/fa1/cu13.part01 .gl/fa2/cu13.part02 .gl/fa3/cu13.part03 > $S/cu13.tar.xz
test "$(sha256sum $S/cu13.tar.xz | awk '{print $1}')" = "$(cat .gl/w/cu13.sha256)" || { echo "cu13 pieces: sha256 differs"; exit 3; }
W=""
for f in .gl/w/*.whl .gl/cb/*.whl; do
  [ -f "$f" ] || continue
  b=$(basename $f); n=$(echo $b | cut -d- -f1 | tr _ -)
  case $n in cuda-bindings|cuda-pathfinder|typing-extensions|protobuf)
    python3 -c "import importlib.metadata as m; m.version('$n')" 2>/dev/null && { echo "skip $b (image has it)"; continue; };;
  esac
  W="$W $f"
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W 2>&1 | tail -3
python3 -c "import tarfile; tarfile.open('$S/cu13.tar.xz').extractall('/tmp/site')"
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import cutlass.cute, flash_attn.cute.interface as i; import flash_attn; print('fa4', getattr(flash_attn, '__version__', '?'))" 2>&1 | tail -2
timeout 420 python3 benchmarks/fa4_decode_attention.py 2>&1 | grep -v DEBUG | tee $OUT/fa4_decode_attention.txt
