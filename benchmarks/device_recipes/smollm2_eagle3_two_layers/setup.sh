#!/bin/bash
# call 1: the wheels into /tmp/site, the GGUF's first piece to /tmp
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py 2>/dev/null
cp .gl/c1/gguf.part00 /tmp/
PYTHONPATH=/tmp/site python3 -c "import hydra, omegaconf, datasets, gguf, accelerate, transformers, torch, triton; print('ok', transformers.__version__, torch.__version__, triton.__version__, datasets.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; df -h /tmp | tail -1
