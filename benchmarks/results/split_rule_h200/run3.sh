#!/bin/bash
# Call 3: the 8B-shape loop at 8K, this tree (DFlash's block attention back on its own split rule) and the tree before
# (c273db1's kernels/decode_attention.py), alternately, two processes each.
set -u
export PYTHONUNBUFFERED=1
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
rm -rf /tmp/before && mkdir /tmp/before && tar cf - --exclude=./benchmarks/results --exclude=./.git . | tar xf - -C /tmp/before
cp before_decode_attention.py /tmp/before/kernels/decode_attention.py
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0 --contexts 8192"
for i in 1 2; do  # ~75 s a process
  timeout 100 python benchmarks/decode_speed.py $A --out $R/after_8k_$i.json > $R/after_8k_$i.txt 2>&1; echo "after rc=$?"
  (cd /tmp/before && timeout 100 python benchmarks/decode_speed.py $A --out $R/before_8k_$i.json) > $R/before_8k_$i.txt 2>&1; echo "before rc=$?"
done
python - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*_8k_*.json"), key=os.path.getmtime):
    d = json.load(open(f)); ar = d["autoregressive"][0]; s = d["speculative"][0]; st = d["forward"]
    print(os.path.basename(f), f"AR {ar['tokens_per_s']:.1f} ({100 * ar['bandwidth_frac']:.1f}%) DFlash {s['tokens_per_s']:.1f} "
          f"{s['speedup'] / 3:.3f} of tau", [(round(x["forward_1_ms"], 3), round(x["forward_16_ms"], 3)) for x in st if x["attention"] == "split_kv"])
PY
