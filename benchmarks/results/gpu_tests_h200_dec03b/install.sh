#!/bin/bash
# call 1 of 2 (the tree + the reference target exceed one call's 64 MiB): hydra, omegaconf, datasets, gguf wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && echo installed
