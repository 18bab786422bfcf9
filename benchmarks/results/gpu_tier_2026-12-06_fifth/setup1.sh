#!/bin/bash
# call 1 of 2: wheels (hydra, omegaconf, datasets, ..., nvidia-cudnn-frontend) into /tmp/site, the reference target's first piece to /tmp
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/p1/*.whl 2>&1 | tail -1
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
cp .gl/p1/tgt_part_aa /tmp/tgt_part_aa; ls -la /tmp/tgt_part_aa; PYTHONPATH=/tmp/site python3 -c "import hydra, datasets, cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())"
