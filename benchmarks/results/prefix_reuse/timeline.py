"""Timeline of a batched CPU pass (batch 8 over eval's two workers): per worker pid, (time, live rows) per verify step,
and when each conversation was claimed and each turn ended, into timeline.jsonl.

    python benchmarks/results/prefix_reuse/timeline.py QUESTIONS EXPORT   # from the repository root
    python benchmarks/results/prefix_reuse/analyze_timeline.py timeline.jsonl
"""
import os, sys, time, json
sys.path.insert(0, ".")
import infer.batch as B
LOG = "timeline.jsonl"
open(LOG, "w").close()
orig = B.staged_verify
def logged(target, ids, positions, first, drafter):
    t0 = time.perf_counter()
    out = orig(target, ids, positions, first, drafter)
    with open(LOG, "a") as f:
        f.write(json.dumps([os.getpid(), t0, time.perf_counter(), int(ids.shape[0])]) + "\n")
    return out
B.staged_verify = logged
import eval.runner as R
orig_db = R.decode_batched
def db(target, drafter, tokenizer, conversations, claim, batch_size, write, finished_one, **kw):
    def c():
        i = claim()
        with open(LOG, "a") as f: f.write(json.dumps(["claim", os.getpid(), time.perf_counter(), i]) + "\n")
        return i
    def w(rec):
        with open(LOG, "a") as f: f.write(json.dumps(["turn", os.getpid(), time.perf_counter(), rec["id"], rec["turn"], len(rec["stats"]["accepted_per_step"]), rec["prompt_tokens"], rec["stats"]["new_tokens"]]) + "\n")
        write(rec)
    return orig_db(target, drafter, tokenizer, conversations, c, batch_size, w, finished_one, **kw)
R.decode_batched = db
sys.argv = ["bt", "--target", "../shared/targets/qwen3-27m-sharegpt", "--drafter", sys.argv[2], "--max-new-tokens", "128",
            "--batch-sizes", "8", "--threads", "2", "--only", "drafter", "--questions", sys.argv[1]]
import runpy
runpy.run_path("benchmarks/batch_throughput.py", run_name="__main__")
