# One H200 (nvidia-h200; no H100 lent), random-init Qwen3-8B shape, nothing carried. Calls 6-8 ran the code of 008d7cc
# (the commits after it before these calls changed only BENCHMARKS.md and results; tree.txt is call 6's), call 9 the
# tiling knob (Tiling/TILING) with the old defaults everywhere.
# call 6: the autoregressive loop at three contexts, the drafters at the first (the script times the drafters at contexts[0])
python benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --contexts 1024 8192 32768 --taus 3 \
  --drafters dflash eagle3 --dflash-draft-steps 0 --out ctx.json                      # call6_ctx.txt
# call 7: one process per context, so that the drafters run at each
for c in 32768 8192 1024; do python benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --contexts $c \
  --taus 3 --drafters dflash eagle3 --dflash-draft-steps 0 --out ctx$c.json; done     # call7_ctx*.txt
# call 8: DFlash's whole block and its first 3 drafts, bf16 and int8 drafter weights, at 32K and 8K
for c in 32768 8192; do python benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --contexts $c \
  --taus 3 --drafters dflash --dflash-draft-steps 0 3 --drafter-weights model int8 --out int8_ctx$c.json; done   # call8_int8_ctx*.txt
# call 9: the target's split-KV attention alone, per pass-1 tiling
python benchmarks/attention_tilings.py                                                # call9_tilings.txt
