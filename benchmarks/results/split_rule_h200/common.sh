# Sourced by run2.sh and run3.sh (run from the repository root on the device).
# Sets up: the GPU's name in $OUT/gpu.txt; /tmp/before, this tree with c273db1's kernels/decode_attention.py (the split
# rule before; shipped for the calls as before_decode_attention.py, else taken from git). summarize: one line per
# decode_speed.py JSON in $OUT, in the order run.
set -u
export PYTHONUNBUFFERED=1
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
rm -rf /tmp/before && mkdir /tmp/before && tar cf - --exclude=./benchmarks/results --exclude=./.git . | tar xf - -C /tmp/before
if [ -f before_decode_attention.py ]; then cp before_decode_attention.py /tmp/before/kernels/decode_attention.py
else git show c273db1:kernels/decode_attention.py > /tmp/before/kernels/decode_attention.py; fi
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash --dflash-draft-steps 0"

summarize() {
python - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*_8k_*.json"), key=os.path.getmtime):
    d = json.load(open(f)); ar = d["autoregressive"][0]; s = d["speculative"][0]; st = d["forward"]
    print(os.path.basename(f), f"AR {ar['tokens_per_s']:.1f} ({100 * ar['bandwidth_frac']:.1f}%) DFlash {s['tokens_per_s']:.1f} "
          f"{s['speedup'] / 3:.3f} of tau", [(round(x["forward_1_ms"], 3), round(x["forward_16_ms"], 3)) for x in st if x["attention"] == "split_kv"])
PY
}
