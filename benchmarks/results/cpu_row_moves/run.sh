#!/bin/bash
# the repository root at 70e1631's code with the patch applied, the venv active; EXPORT: the recipe's DFlash drafter
git apply benchmarks/results/cpu_row_moves/row_moves.patch
python benchmarks/results/cpu_row_moves/ab_moves.py --drafter EXPORT --questions 16 --rounds 3 > ab16.txt
