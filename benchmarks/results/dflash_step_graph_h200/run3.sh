#!/bin/bash
# call 3: where DFlash's block attention spends its time (scratch .whl/diag.py: kernel source variants, one layer at 8K)
R=$OUT; export PYTHONUNBUFFERED=1
timeout 300 python .whl/diag.py > $R/diag.txt 2>&1; echo "rc=$?"; cat $R/diag.txt | tail -20
