#!/bin/bash
# the repository root, the venv active; EXPORT: the recipe's DFlash drafter (results/issue24_recipe_drafter_h200)
T=../shared/targets/qwen3-27m-sharegpt
# one eval cell behind 8,000 filler tokens, 4 MT-Bench conversations (both turns), with and without prefix reuse
/usr/bin/time -f "%e s wall" python -m eval mtbench --target $T --drafter EXPORT --prefill-tokens 8000 --num-questions 4 --max-new-tokens 64 --out OUT_REUSE
/usr/bin/time -f "%e s wall" python -m eval mtbench --target $T --drafter EXPORT --prefill-tokens 8000 --num-questions 4 --max-new-tokens 64 --out OUT_WHOLE --no-prefix-reuse
# issue 24's CPU ratio, interleaved pairs (q16_interleaved_before.txt: the same command at 76dbeac, this session, before)
python benchmarks/batch_throughput.py --target $T --drafter EXPORT --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --interleave \
  --questions 16 --repeat 3 --only drafter > q16_interleaved.txt
python benchmarks/batch_throughput.py --target $T --drafter EXPORT --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --interleave \
  --questions 80 --repeat 2 --only drafter > q80_interleaved.txt
# the drain's timeline at 76dbeac (drain_timeline_76dbeac.txt)
python benchmarks/results/prefix_reuse/timeline.py 16 EXPORT && python benchmarks/results/prefix_reuse/analyze_timeline.py timeline.jsonl
# one step's cost by rows and tokens (stepcost.txt)
python benchmarks/results/prefix_reuse/stepcost.py 1 4 EXPORT; python benchmarks/results/prefix_reuse/stepcost.py 2 1 EXPORT
# EAGLE-3 (a 1-layer drafter of the reference target trained briefly by tests/test_vllm_engine.py's fixture, window 64: a speed check
# of the prefill it skips, not a tau result), the same cell both ways
/usr/bin/time -f "%e s wall" python -m eval mtbench --target $T --drafter EAGLE3_EXPORT --prefill-tokens 8000 --num-questions 4 --max-new-tokens 64 --out OUT_E3
/usr/bin/time -f "%e s wall" python -m eval mtbench --target $T --drafter EAGLE3_EXPORT --prefill-tokens 8000 --num-questions 4 --max-new-tokens 64 --out OUT_E3_WHOLE --no-prefix-reuse
