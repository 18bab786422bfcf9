# The loop with pass 1 of the verify on 32-key tiles, 3 stages, 256-key splits (4 keys a query row at 64 rows): the
# best of call 1's sweep at 8K (21.0 µs a call against 22.5 for the rule's 512-key splits on 64-key tiles)
import runpy, sys; sys.path.insert(0, '.')
import kernels.decode_attention as d
d.MANY_ROWS, d.KEYS_PER_ROW = d.Tiling(32, 4, 3), 4
sys.argv = ['decode_speed.py'] + sys.argv[1:]
runpy.run_path('benchmarks/decode_speed.py', run_name='__main__')
