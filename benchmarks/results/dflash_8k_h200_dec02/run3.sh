#!/bin/bash
# call 4: the DFlash whole block (bf16, the 152K head) at τ = 3 in more processes, one context each, to count how many
# clear 0.80 τ at 8K (the two of call 2: 0.807, 0.795), with 1K and 32K beside
R=$OUT; mkdir -p $R
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0"
for c in 8192 1024 8192 32768 8192; do
  timeout 115 python benchmarks/decode_speed.py $A --contexts $c --out $R/d${c}_$RANDOM.json > /dev/null 2>&1; echo "$c rc=$?"
done
python - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json"), key=os.path.getmtime):
    d = json.load(open(f)); ar = d["autoregressive"][0]; s = d["speculative"][0]
    print(f"{ar['context']:6d} | AR {ar['tokens_per_s']:.1f} tok/s ({100 * ar['bandwidth_frac']:.1f}%) | DFlash {s['tokens_per_s']:.1f} | {s['speedup']:.3f}x = {s['speedup'] / 3:.3f} of tau")
PY
