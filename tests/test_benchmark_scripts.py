"""The benchmark scripts are user-facing: they run on their documented inputs and answer bad input in one line.
Found by review (2026-12-05's fifth session): three regeneration benchmarks failed at start (their settings a namespace
the regeneration no longer read: no ``keep_replies``) and refused builtin target names; missing files and bad flags
gave tracebacks; ``--questions -1`` ran 79 of MT-Bench's 80 questions."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "train" / "data" / "samples" / "sharegpt_sample.jsonl"


def run_script(*args: str, timeout: int = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("script, extra, row", [
    ("regen_vs_loop.py", [], "| 2 | 2/2 |"),
    ("regen_engines.py", ["--engines", "hf", "ours", "--reuse-turns", "on", "off"], "| ours, 8 steps per sync, turn by turn | 16 | 2 |"),
])
def test_regeneration_benchmarks_run_on_a_builtin_target(script, extra, row, tiny_qwen3_path) -> None:
    out = run_script(f"benchmarks/{script}", "--target", "builtin:tiny-qwen3", "--data", str(SAMPLE), "--num", "2",
                     "--max-new-tokens", "4", "--device", "cpu", *extra)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert row in out.stdout, out.stdout


@pytest.mark.parametrize("args, names", [
    (["benchmarks/compare_runs.py", "/nonexistent/a", "/nonexistent/b"], "/nonexistent/a"),
    (["benchmarks/pld_by_span.py", "--target", "builtin:tiny-qwen3", "--data", "/nonexistent/rows.jsonl"], "/nonexistent/rows.jsonl"),
    (["benchmarks/batch_throughput.py", "--target", "builtin:tiny-qwen3", "--device", "cpu", "--only", "pld", "--questions", "-1"],
     "--questions -1"),
])
def test_bad_input_is_one_line(args, names, tiny_qwen3_path) -> None:
    out = run_script(*args)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-1500:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and names in last, out.stderr[-1500:]


def test_on_policy_check_refuses_an_empty_or_cut_file_in_one_line(tiny_qwen3_path, tmp_path) -> None:
    """An empty file scored 0/0 with exit 0; a file cut mid-line named no file and the wrong line (a user's walk)."""
    empty, cut = tmp_path / "empty.jsonl", tmp_path / "cut.jsonl"
    empty.write_text("")
    record = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "token_ids": [5]}]}'
    cut.write_text(record + "\n" + record[:40])
    for path, names in ((empty, "no records"), (cut, "cut.jsonl:2: malformed JSON line")):
        out = run_script("benchmarks/on_policy_check.py", "--target", "builtin:tiny-qwen3", "--data", str(path))
        assert out.returncode != 0 and "Traceback" not in out.stderr and "Loading weights" not in out.stderr, out.stderr[-1500:]
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and names in last, out.stderr[-1500:]


def test_mt_bench_refuses_a_count_below_one() -> None:
    from infer.prompts import mt_bench

    with pytest.raises(ValueError, match=r"--questions -1; expected a number of MT-Bench questions >= 1"):
        mt_bench(-1)
    assert len(mt_bench(3)) == 3 and len(mt_bench()) == 80


GPU_ONLY = {"attention_split_sizes": True, "attention_splits": False, "attention_tilings": False, "block_attention": True,
            "gemv_shapes": False, "probe_attention_kernels": False, "probe_cudnn_band": False, "probe_flex_dflash": True,
            "skinny_gemm": True, "split_k_norm": True, "verify_attention_variants": True, "warm_flashinfer": False,
            "train_attention": True, "decode_speed": True, "profile_decode_loop": True, "profile_target_forward": True,
            "target_forward": True}


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is a CPU machine's answer")
@pytest.mark.parametrize("script", sorted(GPU_ONLY))
def test_gpu_only_scripts_refuse_a_cpu_machine_in_one_line(script) -> None:
    """A CUDA assertion traceback, for six of them even on --help (module-level GPU work, no flags)."""
    out = run_script(f"benchmarks/{script}.py")
    assert out.returncode == 2 and out.stderr.strip() == f"error: {script}.py times GPU kernels; this machine has no CUDA GPU", \
        out.stderr[-1500:]
    helped = run_script(f"benchmarks/{script}.py", "--help")
    assert helped.returncode == 0 and "Traceback" not in helped.stderr and helped.stdout.strip(), helped.stderr[-1500:]
    if not GPU_ONLY[script]:  # no flags: the docstring is the help
        assert helped.stdout.strip().splitlines()[0] in (REPO / "benchmarks" / f"{script}.py").read_text()


def write_result(folder: Path, *, pld: float | None, max_new_tokens: int, num_questions: int,
                 pld_drafting: float | None = None) -> None:
    folder.mkdir(parents=True)
    summary = {"turns": 2 * num_questions, "tau": 3.0, "acceptance_by_position": [0.6, 0.4, 0.2]}
    if pld is not None:
        summary["prompt_lookup"] = {"tau": pld, "tau_drafting_steps": pld_drafting}
    (folder / "results.json").write_text(__import__("json").dumps({
        "config": {"draft_steps": None, "tree_topk": None, "tree_tokens": None, "max_new_tokens": max_new_tokens,
                   "num_questions": num_questions, "prefill_tokens": 0},
        "summary": summary, "records": [{"stats": {"block_size": 4}}]}))


def test_tree_table_borrows_prompt_lookup_only_from_the_same_prompts(tmp_path, monkeypatch, capsys) -> None:
    """A --no-pld folder took prompt lookup's τ from any folder of the same name prefix, even one run on other questions
    and another token budget, unmarked; now only from the same prompts, marked borrowed."""
    from benchmarks import tree_table

    write_result(tmp_path / "mt_a", pld=2.5, max_new_tokens=64, num_questions=10)
    write_result(tmp_path / "mt_b", pld=None, max_new_tokens=256, num_questions=80)
    write_result(tmp_path / "mt_c", pld=None, max_new_tokens=64, num_questions=10)
    monkeypatch.setattr(sys, "argv", ["tree_table.py", *(str(tmp_path / f"mt_{x}") for x in "abc")])
    tree_table.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| mt |")]
    assert "| 160 | 3.000 | 0.60 | - | - | - | - |" in next(line for line in rows if "| 160 |" in line)  # other prompts
    same = [line for line in rows if "| 20 |" in line]  # mt_a's own run, and mt_c borrowing it (the same prompts)
    assert sorted("| 2.500 (3, borrowed) | 1.20× |" in line for line in same) == [False, True]
    assert sorted("| 0.60 | 2.500 (3) | 1.20× |" in line for line in same) == [False, True]


def test_tree_table_prints_prompt_lookups_tau_over_its_drafting_steps(tmp_path, monkeypatch, capsys) -> None:
    """Beside the every-step ratio, the ratio against prompt lookup's τ over its steps with drafts (vLLM's count), from
    the same run (borrowed with it by a --no-pld folder of the same prompts); "-" where the run did not count them."""
    from benchmarks import tree_table

    write_result(tmp_path / "mt_a", pld=2.5, pld_drafting=3.75, max_new_tokens=64, num_questions=10)
    write_result(tmp_path / "mt_b", pld=None, max_new_tokens=64, num_questions=10)
    write_result(tmp_path / "ho_a", pld=2.0, pld_drafting=None, max_new_tokens=64, num_questions=10)  # saved before the count
    monkeypatch.setattr(sys, "argv", ["tree_table.py", *(str(tmp_path / f) for f in ("mt_a", "mt_b", "ho_a"))])
    tree_table.main()
    out = capsys.readouterr().out
    assert "| PLD, steps with drafts | ratio (vLLM's count) |" in out
    mt = [line for line in out.splitlines() if line.startswith("| mt |")]
    assert len(mt) == 2 and all(line.endswith("| 1.20× | 3.750 | 0.80× |") for line in mt)  # τ 3.0 / 3.75
    ho = next(line for line in out.splitlines() if line.startswith("| ho |"))
    assert ho.endswith("| 1.50× | - | - |")


def test_infer_speed_prints_prompt_lookups_tau_on_the_same_prompts(tiny_qwen3_path, tmp_path) -> None:
    """Found by review (2026-12-05's fifth session): ``infer_speed.py`` printed a drafter's tau with no baseline beside it.
    Its PLD column must be prompt lookup's tau on the same prompts, as many drafts a step as the drafter's block; here
    recomputed through the loop with a prompt-lookup drafter loaded on its own."""
    import json

    from test_cli_bad_input import dflash_export

    from infer.generate import generate
    from infer.loading import eos_ids, load_models
    from infer.prompts import long_prompt_ids, mt_bench_questions

    drafter = dflash_export(tiny_qwen3_path, tmp_path / "drafter")  # block 4: prompt lookup drafts 3 a step
    out = run_script("benchmarks/infer_speed.py", "--target", tiny_qwen3_path, "--drafter", str(drafter), "--device", "cpu",
                     "--prefills", "0", "--questions", "2", "--max-new-tokens", "24", "--out", str(tmp_path / "rows.json"))
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads((tmp_path / "rows.json").read_text())[0]
    target, pld, tokenizer = load_models(tiny_qwen3_path, "pld", "cpu", draft_steps=3)
    eos = eos_ids(tokenizer, target.model)
    steps = [a for i in range(2)
             for a in generate(target, pld, long_prompt_ids(tokenizer, mt_bench_questions()[i]["turns"][0], 0, offset=997 * i), 24,
                               eos_token_ids=eos).stats.accepted_per_step]
    assert row["prompt_lookup_tau"] == pytest.approx(sum(a + 1 for a in steps) / len(steps))
    assert f"| {row['spec']['tau']:.3f} | {row['prompt_lookup_tau']:.3f} |" in out.stdout, out.stdout
    assert "PLD tau" in out.stdout.splitlines()[1]

    off = run_script("benchmarks/infer_speed.py", "--target", tiny_qwen3_path, "--drafter", str(drafter), "--device", "cpu",
                     "--prefills", "0", "--questions", "1", "--max-new-tokens", "8", "--no-pld")
    assert off.returncode == 0 and f"| {'-'} |" in off.stdout, off.stdout + off.stderr[-1500:]


def test_eager_target_speed_counts_a_gpt_oss_tokens_bytes_and_runs_on_cpu(tmp_path) -> None:
    """``eager_target_speed.py``'s bandwidth fraction rests on its count of a token's bytes: here against the count by
    hand from the tiny gpt-oss shape's config (attention with biases and sinks, router, norms, the head, top-2 of 8
    experts, no embedding; keys and values of every position on full layers, of the window on sliding ones); and the
    script runs on the CPU, its forced τ = 3 decoding 1.5-3 tokens a step."""
    import json

    from benchmarks.eager_target_speed import bytes_per_token
    from benchmarks.shapes import random_target

    model = random_target("tiny-gpt-oss", "cpu").model  # fp32: 4 bytes a value
    hidden, inter, experts, top, layers, heads, kv_heads, dim, vocab, window = 64, 64, 8, 2, 6, 4, 2, 16, 512, 16
    attention = hidden * heads * dim + heads * dim + 2 * (hidden * kv_heads * dim + kv_heads * dim) + heads * dim * hidden + hidden + heads
    router, norms = experts * hidden + experts, 2 * hidden
    expert = hidden * 2 * inter + 2 * inter + inter * hidden + hidden
    weights = layers * (attention + router + norms) + hidden + vocab * hidden + layers * top * expert
    for context in (8, 100):
        keys = 3 * context + 3 * min(context, window)  # layers alternate sliding, full
        assert bytes_per_token(model, context) == 4 * weights + 2 * kv_heads * dim * 4 * keys

    out = run_script("benchmarks/eager_target_speed.py", "--shape", "tiny-gpt-oss", "--device", "cpu", "--contexts", "40",
                     "--new-tokens", "12", "--taus", "3", "--out", str(tmp_path / "rows.json"))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    row = json.loads((tmp_path / "rows.json").read_text())["rows"][0]
    assert row["context"] == 40 and row["ar_tokens_per_s"] > 0 and row["spec"]["3"]["tokens_per_s"] > 0
    assert out.stdout.splitlines()[2].startswith("40 | ")


@pytest.mark.slow  # three processes, filler of 28,000 tokens: ~25 s alone
def test_prompts_that_fit_keeps_each_questions_id_and_answers_bad_input_in_one_line(reference_target_path, tmp_path) -> None:
    """Found by review (2026-12-06's third session): records without an id were written without one, so the kept file
    and its shards renumbered the questions (shards shared ids: ``sweep_kept_ci.py --merge`` refused them; an id named
    another question than in the original file); a prompt holding U+2028 stopped at an assertion, a byte-order mark at a
    JSON error, a missing target at a traceback, and ``--prefill -5`` wrote an empty file and exited 0."""
    import json

    from infer.prompts import prompts_file

    target = str(reference_target_path)  # 32,768 positions: behind 28,000 filler tokens a 5,000-word prompt does not fit
    prompts = tmp_path / "p.jsonl"
    rows = [{"prompt": "Write a short poem"}, {"prompt": "word " * 5000}, {"prompt": "What is 2+2?\u2028Explain."},
            {"prompt": "Name three colors."}, {"id": "q5", "prompt": "Tell me a joke."}]
    prompts.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    out = run_script("benchmarks/prompts_that_fit.py", "--target", target, "--prompts", str(prompts), "--prefill", "28000",
                     "--max-new-tokens", "32", "--out", str(tmp_path / "fit.jsonl"), "--shards", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    original = {c.id: c.turns for c in prompts_file(prompts)}
    kept = {c.id: c.turns for c in prompts_file(tmp_path / "fit.jsonl")}
    assert list(kept) == ["1", "3", "4", "q5"] and all(kept[i] == original[i] for i in kept)  # question 2 does not fit
    shards = [[c.id for c in prompts_file(tmp_path / f"fit.shard{i}.jsonl")] for i in range(2)]
    assert shards == [["1", "4"], ["3", "q5"]]
    for args, names in ((["--prefill", "-5"], "--prefill -5"), (["--target", str(tmp_path / "nothing")], str(tmp_path / "nothing"))):
        base = {"--target": target, "--prompts": str(prompts), "--prefill": "100", "--max-new-tokens": "32", "--out": str(tmp_path / "bad.jsonl")}
        base.update(dict(zip(args[::2], args[1::2])))
        bad = run_script("benchmarks/prompts_that_fit.py", *[x for kv in base.items() for x in kv])
        last = bad.stderr.strip().splitlines()[-1]
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and last.startswith("error: ") and names in last, bad.stderr[-1500:]
        assert not (tmp_path / "bad.jsonl").exists()


def test_packing_fill_counts_the_rows_each_packing_makes(tmp_path) -> None:
    """``benchmarks/packing_fill.py`` on the builtin sample: its three rows are what ``pack_conversations`` makes of the
    same training split (one row each, next fit, best fit), and the fills follow from the tokens."""
    from benchmarks.train_throughput import compose
    from models.builtin_targets import resolve_target_path
    from models.target import TargetModel
    from train.data import prepare_data
    from train.data.dataset import pack_conversations

    overrides = ["experiment=eagle3_swa_tiny", "data.regenerate.enabled=false", "data.max_length=192", "data.num_eval=16",
                 f"data.cache_dir={tmp_path}"]
    out = run_script("benchmarks/packing_fill.py", *overrides, "--pack-length", "384", "--batch-size", "4")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    tokens = int(re.search(r"training conversations, ([\d,]+) tokens", out.stdout).group(1).replace(",", ""))
    rows = [int(m.replace(",", "")) for m in re.findall(r"^\| [^|]+ \| ([\d,]+) \|", out.stdout, re.M)]
    cfg = compose(overrides + ["output_dir=/tmp/x"])
    train_ds, _, _ = prepare_data(cfg.data, TargetModel.from_pretrained(resolve_target_path(cfg.target.path), "cpu"), seed=cfg.trainer.seed)
    want = [len(train_ds), len(pack_conversations(train_ds, 384, cfg.trainer.seed)), len(pack_conversations(train_ds, 384, cfg.trainer.seed, best_fit=True))]
    assert rows == want and want[2] < want[1] < want[0], (rows, want)
    fills = [float(m) for m in re.findall(r"\| ([\d.]+)% \|", out.stdout)]
    assert fills == [round(100 * tokens / (r * 384), 1) for r in rows], out.stdout


@pytest.mark.slow  # one cold compile of a tiny step (~25 s on one core)
def test_eagle3_step_compile_times_a_cold_compile_in_a_process_of_its_own(tmp_path) -> None:
    """``benchmarks/eagle3_step_compile.py`` on the CPU: one case, its chunk rows and the trainer's rule in the row, a cold
    first step (compiling) longer than the warm one."""
    out = run_script("benchmarks/eagle3_step_compile.py", "--device", "cpu", "--backend", "sdpa", "--shape", "tiny-qwen3",
                     "--rows", "2x8", "--ttt", "2", "--chunks", "2", "--draft-vocab", "64", "--warm-steps", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    row = re.search(r"^\| 1 \| 2 \| 2x8 \| 2 \(8\) \| yes \| 1 \| own \| [\d.]+ \| ([\d.]+) \| ([\d.]+) \| - \|$", out.stdout, re.M)
    assert row and float(row.group(1)) * 1000 > float(row.group(2)), out.stdout
    # how far the case got, as it went (a lease's call cut short showed nothing before): both stamps, the first step's
    # seconds equal to the table's
    assert re.search(r"^\d\d:\d\d:\d\d layers 1, chunks 2: built; compiling the first step$", out.stderr, re.M), out.stderr
    assert f"layers 1, chunks 2: first step (the cold compile) {float(row.group(1)):.1f} s; 2 warm steps" in out.stderr, out.stderr


@pytest.mark.slow
def test_eagle3_step_compile_runs_a_uniform_key_length_case() -> None:
    out = run_script("benchmarks/eagle3_step_compile.py", "--device", "cpu", "--backend", "sdpa", "--shape", "tiny-qwen3",
                     "--rows", "2x8", "--ttt", "3", "--chunks", "1", "--draft-vocab", "64", "--warm-steps", "1", "--uniform-keys")
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"^\| 1 \| 3 \| 2x8 \| 1 \(16\) \| no \| 1 \| uniform \| ", out.stdout, re.M), out.stdout


@pytest.mark.slow
def test_flex_ttt_kernels_compile_one_flex_kernel_for_every_step_with_uniform_keys() -> None:
    """``benchmarks/flex_ttt_kernels_cpu.py``: with each step's own key length the unroll compiles one flex kernel per
    step (3), with uniform key lengths their code is one (buffer numbers aside)."""
    out = run_script("benchmarks/flex_ttt_kernels_cpu.py", "--steps", "3", "--seq", "16")
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"^\| own \| \d+ \| 3 \| 3 \| [\d.]+ \|$", out.stdout, re.M), out.stdout
    assert re.search(r"^\| uniform \| \d+ \| 3 \| 1 \| [\d.]+ \|$", out.stdout, re.M), out.stdout


def test_eagle3_step_compile_refuses_a_machine_without_the_trainers_dependencies(tmp_path) -> None:
    """Without hydra (a lease machine's image, no wheels carried) every case failed only once its process had started and
    a lease's call waited out its limit: now one line before any case."""
    (tmp_path / "hydra").mkdir()
    (tmp_path / "hydra" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'hydra'\", name='hydra')\n")
    out = run_script("benchmarks/eagle3_step_compile.py", "--device", "cpu", "--backend", "sdpa",
                     env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.strip() == ("error: No module named 'hydra': this script imports the trainer (train.eagle3); install the "
                                  "project's dependencies (on a lease machine, the carried wheels on PYTHONPATH)"), out.stderr


@pytest.mark.parametrize("args, message", [
    (["--rows", "16by2048"], "error: --rows '16by2048': expected ROWSxLENGTH, e.g. 16x2048"),
    (["--device", "cpu", "--chunks", "0"], "error: --chunks, --layers, --ttt and --warm-steps: expected positive integers"),
    (["--device", "cpu", "--warm-steps", "0"], "error: --chunks, --layers, --ttt and --warm-steps: expected positive integers"),
    (["--device", "cpu", "--draft-vocab", "1"], "error: --draft-vocab 1: expected 2 to smollm2-135m's vocabulary (49152)"),
    (["--device", "cpu"], "error: --device cpu --backend flex: flex attention has no CPU backward; use --backend sdpa on the CPU"),
])
def test_eagle3_step_compile_answers_bad_input_in_one_line(args, message) -> None:
    out = run_script("benchmarks/eagle3_step_compile.py", *args)
    assert out.returncode == 1 and out.stderr.strip() == message, out.stderr


@pytest.mark.slow  # five processes (~30 s)
def test_prefill_rows_profile_runs_on_the_cpu_and_refuses_a_bad_case_in_one_line() -> None:
    """``profile_prefill_rows.py`` (where a regeneration's waves spend their time, by SDPA backend): both tables on the
    CPU, the synthetic regeneration with the same replies for each backend set; a malformed or oversized case is one
    line naming it."""
    out = run_script("benchmarks/profile_prefill_rows.py", "--shape", "tiny-qwen3", "--device", "cpu", "--batch", "8",
                     "--repeats", "1", "--backends", "ours", "torch", "--cases", "2x20@0", "3x10@30", "--trace",
                     "--streams", "6", "--max-new-tokens", "4")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    for row in ("| ours | 2x20@0 | 40 |", "| torch | 3x10@30 | 30 |"):
        assert row in out.stdout, out.stdout
    streams = [line.split("|") for line in out.stdout.splitlines() if re.match(r"\| (ours|torch) \| 6 \|", line)]
    assert len(streams) == 2 and streams[0][3] == streams[1][3], out.stdout  # the same replies under both
    for case, says in (("6x", "'6x'"), ("9x10@0", "--batch 8"), ("2x10@5000", "--capacity")):
        bad = run_script("benchmarks/profile_prefill_rows.py", "--shape", "tiny-qwen3", "--device", "cpu", "--batch", "8",
                         "--cases", case)
        assert bad.returncode != 0 and "Traceback" not in bad.stderr and says in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()[-1]) > 20


@pytest.mark.slow  # four processes (~10 s); the renderer itself is checked in the quick tier (test_chat_masks.py)
def test_chat_render_speed_times_both_rows_and_refuses_a_bad_file_in_one_line(tmp_path, reference_target_path,
                                                                               reference_tokenizer) -> None:
    """``chat_render_speed.py`` on a regenerated file (replies with their ids; one plain JSONL, one xz-compressed): both
    rows, every reply read as its ids, the same digests from either file; a missing or broken file is one line."""
    import json
    import lzma

    tok = reference_tokenizer
    lines = []
    for i in range(5):
        messages = []
        for k in range(3):
            text = f"Answer {k} to question {i}."
            messages += [{"role": "user", "content": f"Question {i}, turn {k}?"},
                         {"role": "assistant", "content": text, "token_ids": tok(text, add_special_tokens=False)["input_ids"]}]
        lines.append(json.dumps({"id": f"c{i}", "messages": messages}))
    plain = tmp_path / "regen.jsonl"
    plain.write_text("\n".join(lines) + "\n")
    packed = tmp_path / "regen.jsonl.xz.part00"
    packed.write_bytes(lzma.compress(plain.read_bytes()))
    tables = []
    for data in (plain, packed):
        out = run_script("benchmarks/chat_render_speed.py", "--target", str(reference_target_path), "--data", str(data), "--rows", "2")
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert "5 conversations, 15 assistant turns" in out.stdout and "15 replies as their ids, 0 from their text" in out.stdout, out.stdout
        tables.append([line.split("|")[5] for line in out.stdout.splitlines() if line.startswith(("| prompt_ids", "| tokenize_batch"))])
    assert len(tables[0]) == 2 and tables[0] == tables[1]
    broken = tmp_path / "broken.jsonl.xz"
    broken.write_bytes(b"not xz")
    for data, says in ((tmp_path / "none.jsonl", "no such file"), (broken, "not one whole xz stream")):
        bad = run_script("benchmarks/chat_render_speed.py", "--target", str(reference_target_path), "--data", str(data))
        assert bad.returncode != 0 and "Traceback" not in bad.stderr and says in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
