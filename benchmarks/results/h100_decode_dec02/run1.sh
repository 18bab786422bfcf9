#!/bin/bash
# Issue 24 on an H100: DFlash's whole block (bf16, 152K head) at τ = 3 beside the autoregressive loop, 8K in two
# processes, then one process over 1K / 8K / 32K with EAGLE-3 beside it.
R=$OUT; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
A="--compile --no-eager-baseline --attention split_kv --taus 3 --dflash-draft-steps 0"
for i in 1 2; do timeout 110 python benchmarks/decode_speed.py $A --drafters dflash --contexts 8192 --out $R/d8192_$i.json > $R/d8192_$i.log 2>&1; echo "8192 #$i rc=$?"; done
timeout 345 python benchmarks/decode_speed.py $A --drafters dflash eagle3 --contexts 1024 8192 32768 --out $R/all3.json > $R/all3.log 2>&1; echo "all3 rc=$?"
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
