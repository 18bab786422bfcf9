#!/bin/bash
# call 1 (with the first piece): what the image has of FA4's dependencies
python3 - <<'PY'
import importlib.metadata as m, sys
print(sys.version.split()[0])
for d in ["cuda-bindings", "cuda-pathfinder", "protobuf", "typing_extensions", "einops", "apache-tvm-ffi", "torch-c-dlpack-ext", "quack-kernels", "torch", "triton"]:
    try: print("image has", d, m.version(d))
    except m.PackageNotFoundError: print("image lacks", d)
PY
ls -la .gl/fa0
