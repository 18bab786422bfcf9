#!/bin/bash
# Issue 24 on an H100, second call: DFlash (bf16 whole block) and EAGLE-3 at τ = 3 at 8K (twice) and 32K, one context a process
R=$OUT; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
A="--compile --no-eager-baseline --attention split_kv --taus 3 --dflash-draft-steps 0"
for c in 8192 32768 8192; do n=de${c}_$RANDOM; timeout 150 python benchmarks/decode_speed.py $A --drafters dflash eagle3 --contexts $c --out $R/$n.json > $R/$n.log 2>&1; echo "$c rc=$?"; done
python - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json"), key=os.path.getmtime):
    d = json.load(open(f)); print(os.path.basename(f), d["gpu"], "bandwidth", d["bandwidth"])
    for fw in d["forward"]:
        print(f"  fwd {fw['context']:6d}: 1-token {fw['forward_1_ms']:.2f} ms, 16-token {fw['forward_16_ms']:.2f} ms ({fw['verify_over_decode']:.3f}x)")
    ar = {a["context"]: a for a in d["autoregressive"]}
    for a in d["autoregressive"]:
        print(f"  AR {a['context']:6d}: {a['tokens_per_s']:.1f} tok/s ({100 * a['bandwidth_frac']:.1f}%)")
    for s in d["speculative"]:
        print(f"  {s['drafter']:8s} {s.get('context', '')} tau {s['tau']}: {s['tokens_per_s']:.1f} tok/s, {s['speedup']:.3f}x = {s['speedup'] / s['tau']:.3f} of tau")
PY
