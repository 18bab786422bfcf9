# One H200 (nvidia-h200), four device calls; the repository as committed at each call (calls 1-2: 0049e36; calls 3-4:
# with the fused split-K sum of kernels/skinny_gemm.py). Nothing else carried: random-init Qwen3-8B shape.
# call 1
python -m pytest -q -p no:cacheprovider -o addopts="" tests/test_int8_weights.py tests/test_skinny_gemm.py tests/test_static_drafters.py -k "gpu or cuda or triton"  # gpu_tests_call1.txt
python benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --contexts 1024 --taus 3 --drafters dflash --dflash-draft-steps 0 3 --dflash-weights model int8 --out decode1.json  # decode1.txt
python benchmarks/skinny_gemm.py --int8 --rows 16  # int8_products_before_reduce.txt
# call 2
python -m pytest -q -rA -p no:cacheprovider -o addopts="" tests/test_int8_weights.py -k "gpu or cuda"  # gpu_tests_int8.txt
python benchmarks/decode_speed.py ... (as call 1) --out decode2.json  # decode2.txt
python benchmarks/profile_decode_loop.py --dflash-block --dflash-weights model int8  # block_before_reduce.txt
# call 3 (after the fused split-K sum)
python -m pytest -q -p no:cacheprovider -o addopts="" tests/test_int8_weights.py tests/test_skinny_gemm.py -k "gpu or cuda"  # gpu_tests_after_reduce.txt
python benchmarks/skinny_gemm.py --int8 --rows 16 1 --out int8_products.json  # int8_products.txt
python benchmarks/decode_speed.py ... (as call 1) --out decode3.json  # decode3.txt
# call 4
python benchmarks/decode_speed.py ... (as call 1) --out decode4.json  # decode4.txt
python benchmarks/profile_decode_loop.py --dflash-block --dflash-weights model int8  # block.txt
# call 5 (EAGLE-3 with int8 weights, de707a6)
python -m pytest -q -rA -p no:cacheprovider -o addopts="" tests/test_int8_weights.py tests/test_static_eagle3.py -k "cuda or gpu"  # gpu_tests_eagle3.txt
python benchmarks/decode_speed.py --compile --no-eager-baseline --attention split_kv --contexts 1024 --taus 3 --drafters eagle3 --drafter-weights model int8 --out eagle3.json  # eagle3.txt
