#!/bin/bash
# a call between setup.sh and start.sh (the machine still warm): the regenerated file an earlier lease returned, carried in
# .gl/c4/ as its xz pieces and regen.sha256, unpacked to /tmp/pf/regen.jsonl and checked; then start.sh with
# REGEN_FILE=/tmp/pf/regen.jsonl trains on it
set -eu; mkdir -p /tmp/pf
cat .gl/c4/regen.jsonl.xz.part* | xz -dc > /tmp/pf/regen.jsonl
want=$(cut -d' ' -f1 .gl/c4/regen.sha256); have=$(sha256sum /tmp/pf/regen.jsonl | cut -d' ' -f1)
[ "$want" = "$have" ] || { echo "regen.jsonl: sha256 $have, expected $want (regen.sha256): pieces missing or out of order"; exit 1; }
wc -l /tmp/pf/regen.jsonl; echo "sha256 ok"
