#!/bin/bash
# the tree (48 MB) leaves ~18 MB a call: the reference target carried in four pieces (.gl/p1, .gl/p2, .gl/p3, then
# .target/p4 with the small files, one call each, the machine kept warm between them), joined here
set -e
mkdir -p .target/qwen3-27m-sharegpt
cp .gl/p1/* .gl/p2/* .gl/p3/* .target/p4/* .target/qwen3-27m-sharegpt/
ls .target/qwen3-27m-sharegpt | wc -l
