import sys, runpy, torch
sys.argv = ["batch_throughput.py", "--target", "/work/shared/targets/qwen3-27m-sharegpt", "--drafter", "/work/recipe_export",
            "--questions", "4", "--max-new-tokens", "64", "--batch-sizes", "4", "--threads", "1", "--cpu-workers", "1", "--only", "drafter"]
sys.path.insert(0, "/work/main/benchmarks")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
    runpy.run_path("/work/main/benchmarks/batch_throughput.py", run_name="__main__")
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=30, max_shapes_column_width=90))
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=40))
