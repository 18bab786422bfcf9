import runpy, sys; sys.path.insert(0, '.')
import kernels.decode_attention as d; d.KEYS_PER_ROW = 8   # the split rule before: 8 keys a query row
sys.argv = ['decode_speed.py'] + sys.argv[1:]
runpy.run_path('benchmarks/decode_speed.py', run_name='__main__')
