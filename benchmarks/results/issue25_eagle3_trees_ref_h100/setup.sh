#!/bin/bash
# call 1 of 2: wheels into /tmp/site, the prompts and the reference target's first piece to /tmp
E=.gl/e3a
python3 -m pip install -q --no-index --no-deps --target /tmp/site $E/*.whl 2>&1 | tail -1
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
mkdir -p /tmp/pf /tmp/e3; xz -dc $E/p5000.jsonl.xz > /tmp/pf/p5000.jsonl; cp $E/sharegpt_heldout_prompts.jsonl /tmp/pf/; cp $E/tgt_part_aa /tmp/
wc -l /tmp/pf/*; PYTHONPATH=/tmp/site python3 -c "import hydra, datasets; print('ok')"; nvidia-smi --query-gpu=name --format=csv,noheader
