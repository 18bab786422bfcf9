# Not run yet (this session's device time was spent): the loop at 32K and 8K with the verify's three-stage tiling
# (the default since 46d1ab7) against the two-stage one, in the same call, DFlash's whole block and EAGLE-3.
A="--compile --no-eager-baseline --attention split_kv --taus 3 --drafters dflash eagle3 --dflash-draft-steps 0"
for c in 32768 8192; do
  python benchmarks/decode_speed.py $A --contexts $c --out stages3_$c.json > stages3_$c.txt
  python -c "
import runpy, sys; sys.path.insert(0, '.')
import kernels.decode_attention as d; d.MANY_ROWS_FROM = 10**9   # the two-stage tiling at every row count, as before
sys.argv = ['decode_speed.py'] + sys.argv[1:]
runpy.run_path('benchmarks/decode_speed.py', run_name='__main__')" $A --contexts $c --out stages2_$c.json > stages2_$c.txt
done
