#!/bin/bash
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gl/mini/*.whl 2>&1 | tail -1
sed -i 's/^TORCHVISION_AVAILABLE = .*/TORCHVISION_AVAILABLE = False/' /tmp/site/datasets/config.py
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests
timeout 230 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_packed_documents.py -k "compiled_tile_structure_and_flex" 2>&1 | tail -15 | tee $OUT/gpu_docs_test.txt
