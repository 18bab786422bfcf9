#!/bin/bash
# call 1: wheels into /tmp/site, the GGUF's first piece to /tmp
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/sm1/*.whl 2>&1 | tail -2
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
cp .gl/sm1/gguf.part00 /tmp/
PYTHONPATH=/tmp/site python3 -c "import hydra, omegaconf, datasets, gguf, accelerate, transformers, torch; print('ok', transformers.__version__, torch.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
