"""``python -m train`` under a launcher with rank 1 reaching the training loop ``SKEW`` seconds after rank 0 (its clock
for ``trainer.time_limit_minutes`` starts that much later), as W&B's set-up or the loop evaluation on rank 0 alone make
it. Only a sleep is added after the resume; the trainer runs unchanged. Used by tests/test_deepspeed.py."""

import os
import runpy
import sys
import time

import train.checkpoint

resume = train.checkpoint.Checkpointer.resume


def late_resume(self, how):
    state = resume(self, how)
    if int(os.environ.get("RANK", 0)) == 1:
        time.sleep(float(os.environ.get("SKEW", "0")))
    return state


train.checkpoint.Checkpointer.resume = late_resume
sys.argv = ["train", *sys.argv[1:]]
runpy.run_module("train", run_name="__main__", alter_sys=True)
