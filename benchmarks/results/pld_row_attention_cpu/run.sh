# A 2-core AMD EPYC with AVX-512 (avx512f/bw/vl/vnni/bf16; no AMX), the CI venv (torch 2.13.0+cpu), nothing else running.
# A/B inside one process (the module flag models.static_target.ROW_ATTENTION_ON_CPU), batch 1 then batch 8 padded / per row
# in alternating order, all 80 MT-Bench conversations, 128 new tokens a turn, prompt lookup with 15 drafts:
python benchmarks/results/pld_row_attention_cpu/ab_rows.py 80 3   # ab_rows.txt (first_try.txt: an earlier version, wall clock only)
# the measurement at f26d9aa, interleaved pairs:
B="python benchmarks/batch_throughput.py --target ../shared/targets/qwen3-27m-sharegpt --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --interleave --only pld --pld-drafts 15"
$B --questions 80 --repeat 2 > q80_pld.txt
$B --questions 16 --repeat 4 > q16_pld.txt
