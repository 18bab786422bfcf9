"""``python -m eval``: acceptance length and speed of a drafter behind long prompts.

    python -m eval mtbench --num-questions 10               # the latest `python -m train` run, MT-Bench, both turns
    python -m eval mtbench --target T --drafter D --prefill-tokens 32768 --window none
    python -m eval prompts --prompts my.jsonl --window 512
    python -m eval sweep --windows none 2048 --prefills 0 4096 8192 16384 32768   # resumable

Results go to ``--out`` (default ``outputs/eval/<command>/<drafter>-<hash of the settings>``, so the same
command finds its earlier results): ``results.json`` (config, summary, one record per question turn),
``summary.md``; a sweep adds ``cells/*.json``, ``sweep.md`` (τ, tokens/s, τ kept against the smallest prefill,
and how many turns the target answered with the same text as there) and ``tau_vs_context.png``. Every finished turn
is appended to ``partial/*.jsonl`` as it ends: a run stopped by Ctrl-C or a kill resumes where it stopped
when the same command is run again. ``--wandb`` mirrors it to W&B (offline without an API key).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from common.cli_help import DefaultsHelpFormatter



def latest_run(root: Path = Path("outputs")) -> dict:
    """The newest ``run.json`` under ``root`` whose export folder exists (what ``python -m train`` wrote)."""
    from infer.loading import run_export_path

    runs = sorted(root.glob("**/run.json"), key=lambda p: p.stat().st_mtime, reverse=True) if root.exists() else []
    for path in runs:
        try:
            run = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e}); expected a training run's run.json (pass --target and --drafter, "
                             "or another --runs-dir)") from None
        export = run_export_path(path.parent, run.get("export")) if isinstance(run, dict) else None
        if export and (export / "config.json").exists():
            target = run.get("target")
            if not isinstance(target, dict) or not isinstance(target.get("path"), str):
                raise ValueError(f"{path}: field 'target' is {target!r}; expected {{\"path\": TARGET}} (pass --target and --drafter)")
            return {"target": target["path"], "drafter": str(export), "run": str(path.parent)}
    raise ValueError(f"no --drafter given and no finished training run (run.json with an export) under {root}/; "
                     "run `python -m train ...` first or pass --target and --drafter")


def parse_args(argv=None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", help="HF target folder/id, or builtin:NAME (models/builtin_targets.py; an unknown name is "
                                         "refused with the list) (default: the target recorded in the training run)")
    common.add_argument("--drafter", help="a training run folder (python -m train's output_dir), an exported DFlash or EAGLE-3 "
                                          "drafter (a folder or a hub id), or 'pld' for prompt lookup (default: the newest run under --runs-dir)")
    common.add_argument("--pld", action=argparse.BooleanOptionalAction, default=True,
                        help="also run prompt lookup (n-gram drafting, as many drafts per step as the drafter) on the same prompts: "
                             "the free baseline beside every tau")
    common.add_argument("--runs-dir", default="outputs", help="where to look for the latest training run")
    common.add_argument("--prefill-tokens", type=int, default=0, help="filler tokens before the first question")
    common.add_argument("--temperature", type=float, default=0.0)
    common.add_argument("--top-p", type=float, default=1.0)
    common.add_argument("--top-k", type=int, default=0)
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--max-new-tokens", type=int, default=256)
    common.add_argument("--num-questions", type=int, help="first N questions (default: all)")
    common.add_argument("--device", default="auto", help="auto = cuda when there is a GPU, else cpu")
    common.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    common.add_argument("--draft-steps", type=int,
                        help="EAGLE-3: drafts per step, the chain's length (default: the TTT steps it was trained with); prompt "
                             "lookup beside it drafts as many. With --drafter pld: its drafts per step (default 15). DFlash chains: "
                             "the first N drafts of the block verified (default all: block size - 1; a shorter verify for "
                             "compute-bound steps, e.g. batches on the CPU)")
    common.add_argument("--tree-topk", type=int, help="dynamic tree drafting (EAGLE-3: EAGLE-2's trees; DFlash: over its block's "
                                                      "marginals), top-k children per node and nodes expanded per depth (greedy; "
                                                      "prompt lookup beside drafts a chain as deep as the tree)")
    common.add_argument("--tree-tokens", type=int, help="dynamic tree drafting (EAGLE-3, DFlash): nodes verified per step")
    common.add_argument("--tree-lookup", type=int, default=0, help="trees: prompt lookup's chain of up to N drafts joins each "
                                                                    "tree as one more branch (hybrid drafting; prompt lookup beside "
                                                                    "drafts max(depth, N); default 0: none)")
    common.add_argument("--tree-redraft", type=int, default=0, help="DFlash trees: the nodes expanded at depths 1 .. N are drafted "
                                                                     "again with their path in place of mask tokens (one block pass "
                                                                     "per node; a drafter trained with drafter.reveal_prob); default 0")
    common.add_argument("--drafter-weights", default="model", choices=["model", "int8"],
                        help="the drafter's matrices as loaded, or weight-only int8 copies of them (DFlash: and of the LM head it "
                             "drafts with; half the bytes a drafting pass reads on a GPU, faster up to 16-32 rows a product (DFlash: "
                             "batch x block), slower past 64; the target untouched, its output the same)")
    common.add_argument("--batch-size", type=int, default=1,
                        help="conversations decoded at once (DFlash, EAGLE-3, prompt lookup or the target alone; each row's tokens and "
                             "acceptance are batch 1's)")
    common.add_argument("--threads", type=int, help="CPU threads (default on CPU: one per core when batched, or at --batch-size 1 "
                                                    "for a target of 10M parameters or more; 1 for a smaller one, whose decoding "
                                                    "runs faster on one)")
    common.add_argument("--cpu-workers", type=int, default=0,
                        help="batched on the CPU: split the rows and the conversations over this many forked one-thread processes "
                             "(default 0 = on Linux, one per core when --batch-size gives every core at least 4 rows and --threads is not set; "
                             "1 = one process); each row's tokens are the same")
    common.add_argument("--no-prefix-reuse", dest="prefix_reuse", action="store_false",
                        help="prefill every turn's whole prompt (default: the target alone, prompt lookup, DFlash and EAGLE-3 prefill a turn only "
                             "past what the caches hold from the turn before, its earlier turns and answers)")
    common.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                        help="untimed, before each pass: a batched pass runs a few steps of its shapes, a batch-1 pass decodes its "
                             "first turn once, so tok/s, latency and speedup are steady-state (default: on a GPU, where this compiles "
                             "and captures the graphs; the summary prints how long it took)")
    common.add_argument("--backend", default="sdpa", choices=["sdpa", "flashinfer"])
    common.add_argument("--engine", default="ours", choices=["ours", "vllm", "server", "zlab"],
                        help="who decodes: our loop, vLLM in its own environment, a running server (--server), or z-lab's "
                             "reference DFlash loop (PyPI dflash, in this process, DFlash only); another engine decodes "
                             "greedily with the export's window, tau from its own counters, tokens checked against our target alone")
    common.add_argument("--vllm-python", help="--engine vllm: the vLLM environment's python (default: $SWA_VLLM_PYTHON)")
    common.add_argument("--server", metavar="URL", help="a running OpenAI-compatible vLLM server serving --target with --drafter "
                                                        "(generation by /v1/completions, acceptance from its /metrics)")
    common.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                        help="also decode autoregressively for the speedup (default: on, off in sweeps)")
    common.add_argument("--out", help="results folder (default: outputs/eval/<command>/<drafter>-<settings hash>; the same "
                                      "command resumes there)")
    common.add_argument("--wandb", action="store_true", help="log to W&B (online with an API key, else offline)")
    common.add_argument("--wandb-project", default="swa-drafters-eval")

    p = argparse.ArgumentParser(prog="python -m eval", description=__doc__.splitlines()[0])
    formatter = DefaultsHelpFormatter
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("mtbench", "MT-Bench, 80 questions, both turns"), ("prompts", "a JSONL file of prompts")):
        s = sub.add_parser(name, parents=[common], help=help_, formatter_class=formatter)
        s.add_argument("--window", default="trained", help="drafter window at inference: trained | none | W")
        if name == "prompts":
            s.add_argument("--prompts", required=True, help="JSONL: {prompt} | {turns: [...]} | {messages: [...]} per line")
    s = sub.add_parser("sweep", parents=[common], help="windows x prefill lengths", formatter_class=formatter)
    s.add_argument("--windows", nargs="+", default=["none", "2048"])
    s.add_argument("--prefills", type=int, nargs="+", default=[0, 4096, 8192, 16384, 32768])
    s.add_argument("--prompts", help="a JSONL prompt file instead of MT-Bench")
    return p.parse_args(argv)


def with_local_paths_resolved(source: dict) -> dict:
    """The run's target, drafter and run folder, each local folder by its absolute path: ``run_df``, ``run_df/`` and
    ``./run_df`` are one drafter (each hashed to a results folder of its own before, so a rerun spelled otherwise started
    again, and an explicit --out refused it). Hub ids, ``builtin:`` names and ``pld`` stay as given."""
    from infer.loading import PROMPT_LOOKUP

    return {k: str(Path(v).resolve()) if isinstance(v, str) and v != PROMPT_LOOKUP and Path(v).exists() else v
            for k, v in source.items()}


def default_out(args, source: dict) -> Path:
    """The same command (same drafter, target, prompts and settings) gets the same folder: reruns resume."""
    # batch size and threads change the speed, not the tokens: a rerun with another one resumes the same folder
    settings = {k: v for k, v in sorted(vars(args).items()) if k not in SPEED_ONLY}
    if settings.get("drafter_weights") == "model":  # the default: the folders of runs from before the option keep their hash
        del settings["drafter_weights"]
    settings.update(source)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    name = "pld" if source["drafter"] == "pld" else Path(source.get("run") or source["drafter"]).name
    return Path("outputs") / "eval" / args.command / f"{name}-{digest}"


# what changes no token and no τ (speed, where results go), and what the results' own file names already keep apart
# (window, prefill, baseline: ``partial/window-W_prefill-P*.jsonl``, ``cells/``; questions: resumed by id and turn)
SPEED_ONLY = ("out", "wandb", "wandb_project", "threads", "runs_dir", "batch_size", "cpu_workers", "warmup")
# what a finished sweep cell must share with this run to be reused (settings.json keeps them apart: they do not change
# a turn's tokens, but they change which turns and passes a cell holds)
CELL_SETTINGS = ("num_questions", "baseline", "pld")
KEPT_APART = ("window", "windows", "prefill_tokens", "prefills", "num_questions", "baseline", "pld")


def results_settings(args, source: dict) -> dict:
    """What a results folder's turns depend on, written beside them (``settings.json``): a rerun into the folder must
    match, or its turns would mix with the earlier ones under one config (an explicit ``--out`` reused with other
    settings; a prompts file edited, or a drafter retrained into the same folder, under the same default folder)."""
    settings = {k: v for k, v in sorted(vars(args).items()) if k not in SPEED_ONLY + KEPT_APART}
    settings.update(source)
    prompts = getattr(args, "prompts", None)
    if prompts:
        settings["prompts_sha256"] = hashlib.sha256(Path(prompts).read_bytes()).hexdigest()
    drafter = Path(str(source.get("drafter")))
    if drafter.is_dir():  # its files' sizes and times: retrained into the same folder, the drafter is another
        settings["drafter_files"] = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(drafter.iterdir()) if f.is_file()]
    return json.loads(json.dumps(settings, default=str))


def check_settings(out: Path, settings: dict) -> None:
    """A folder with results of other settings (``settings.json``) is refused in one line naming the first that differs.
    A folder whose settings were written but holds no result yet (a run refused after writing them) is not: the
    corrected command runs there."""
    path = out / "settings.json"
    if not path.is_file():
        return
    if not any(p.is_file() and p != path and p.stat().st_size > 0 for p in out.rglob("*")):
        return
    from common.json_file import read_json_object

    before = read_json_object(path, "the settings its results were made with")
    differ = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
    if differ:
        k = differ[0]
        raise ValueError(f"{out}: holds results made with {k}={before.get(k)!r}, this run has {settings.get(k)!r}; expected the same "
                         "settings to resume (use another --out, or delete the folder)")


def check_out(out: Path) -> None:
    """--out must be a folder or a path one can be made at: not a file, nor under one."""
    from common.atomic import unwritable_reason

    blocked = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise ValueError(f"--out {out}: {blocked} is a file; expected a results folder")
    reason = unwritable_reason(out)  # before the models load: a results folder that cannot be made failed after them
    if reason:
        raise ValueError(f"--out {out}: {reason}; expected a results folder that can be written")
    held = next((name for name in ("run.json", "checkpoints", "export", "config.json") if (out / name).exists()), None)
    if held is not None:  # results.json, settings.json and partial/ were written beside a training run's or a drafter's files
        raise ValueError(f"--out {out}: holds {held}, a training run or an exported drafter; expected a results folder "
                         "(new, or one eval wrote)")


def read_cell(path: Path) -> dict:
    """A finished sweep cell (cells/*.json), or one clear error naming the file."""
    from common.json_file import read_json_object

    expected = "a finished cell with 'summary' and 'records'; delete it to compute the cell again"
    done = read_json_object(path, expected)
    if not isinstance(done.get("summary"), dict) or not isinstance(done.get("records"), list):
        raise ValueError(f"{path}: expected a finished cell with 'summary' and 'records'; delete it to compute the cell again")
    return done


def conversations_for(args):
    from infer.prompts import mt_bench, prompts_file

    if args.num_questions is not None and args.num_questions < 1:
        raise ValueError(f"--num-questions {args.num_questions}; expected >= 1")
    prompts = getattr(args, "prompts", None)
    conversations = prompts_file(prompts) if prompts else mt_bench()
    if args.num_questions is not None and args.num_questions > len(conversations):  # was cut to what there is, silently,
        # while results.json recorded the number asked for
        raise ValueError(f"--num-questions {args.num_questions}; {prompts or 'MT-Bench'} has {len(conversations)} "
                         f"{'records' if prompts else 'questions'} (expected at most that, or leave it out for all)")
    return conversations[:args.num_questions]


def interrupt_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # a job scheduler's SIGTERM ends the run as Ctrl-C does: workers stopped, finished turns kept


def main(argv=None) -> int:
    import signal
    import threading

    args = parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C or SIGTERM): finished turns are kept; the same command resumes", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    # heavy imports after argument parsing: --help and argument errors answer at once
    from eval.bootstrap import per_question
    from eval.report import log_wandb, summary_table, sweep_plot, sweep_tables
    from eval.runner import as_engine_counts, check_context_fits, cpu_workers, max_positions, run_conversations, summarize
    from infer.loading import (PROMPT_LOOKUP, check_backend, drafting_label, eos_ids, load_models, parse_window, recorded_target_warning, resolve_device,
                               resolve_run, set_threads, target_setting, window_warning)
    from infer.prompt_lookup import PromptLookupDrafter
    from models.sampling import sampling_from_flags
    from common.atomic import atomic_open
    from eval.engines import check_engine_args, start_engine

    def write_json(path: Path, obj) -> None:
        with atomic_open(path) as f:
            json.dump(obj, f, indent=1)

    try:
        args.device = resolve_device(args.device)
        set_threads(args.device, args.threads, args.batch_size)
        windows = [parse_window(w) for w in (args.windows if args.command == "sweep" else [args.window])]
        for name, values in (("--windows", windows), ("--prefills", getattr(args, "prefills", []))):
            for i, value in enumerate(values):
                if value in values[:i]:
                    raise ValueError(f"{name}: {'none' if value is None else value} given twice; expected each once")
        # flags that would be ignored with exit 0, their value written into the results' settings and titles
        if args.command == "sweep" and args.prefill_tokens:
            raise ValueError(f"--prefill-tokens {args.prefill_tokens} sets mtbench's and prompts' filler; a sweep's are --prefills")
        for name, values in (("--prefill-tokens", [args.prefill_tokens]), ("--prefills", getattr(args, "prefills", []))):
            for value in values:
                if value < 0:
                    raise ValueError(f"{name} {value}; expected filler token counts >= 0")
        if args.max_new_tokens < 2:  # before any model loads or results folder is made (the loop said so mid-cell)
            # 1: the prefill makes the only token, no verify step to measure (τ came out 0, the sweep divided by it)
            raise ValueError(f"--max-new-tokens {args.max_new_tokens}; expected >= 2 (the first new token comes from the prefill: "
                             "τ needs verify steps after it)")
        sampling = sampling_from_flags(args.temperature, args.top_k, args.top_p, args.seed)
        check_engine_args(args, windows)
        if not sampling.greedy and (args.tree_topk is not None or args.tree_tokens is not None):  # the loop refused it at the first
            # drafted turn, after the baseline pass had decoded and settings.json and partial/ were written
            raise ValueError(f"--temperature {args.temperature}: tree drafting (--tree-topk/--tree-tokens) is greedy only; leave out "
                             "the tree options to sample with chains")
        if args.command != "sweep" and args.drafter == PROMPT_LOOKUP and args.window != "trained":
            raise ValueError(f"--window {args.window} sets a trained drafter's attention window; prompt lookup (--drafter pld) "
                             "has none")
        conversations = conversations_for(args)
        if args.drafter is None:
            source = latest_run(Path(args.runs_dir))
            print(f"no --drafter: using the newest training run {source['run']}", file=sys.stderr)
            source["target"] = args.target or source["target"]
        else:
            target_path, drafter_path, run_dir = resolve_run(args.target, args.drafter)
            if target_path is None:
                raise ValueError("--drafter given without --target (a training run folder records its target; an export does not)")
            source = {"target": target_path, "drafter": drafter_path, **({"run": run_dir} if run_dir else {})}
        source = with_local_paths_resolved(source)
        if args.batch_size < 1:
            raise ValueError(f"--batch-size {args.batch_size}; expected >= 1")
        if args.batch_size > 1 and args.backend == "flashinfer":  # before anything loads or is written (it failed mid-cell)
            raise ValueError(f"--batch-size {args.batch_size}: batched decoding runs on the static target; --backend flashinfer "
                             "decodes at --batch-size 1")
        check_backend(args.backend, args.device)  # before anything loads or is written
        out = Path(args.out) if args.out else default_out(args, source)
        check_out(out)
        settings = results_settings(args, source)
        check_settings(out, settings)
        target, drafter, tokenizer = load_models(source["target"], source["drafter"], args.device, args.dtype, windows[0], args.backend,
                                                 draft_steps=args.draft_steps, tree_topk=args.tree_topk, tree_tokens=args.tree_tokens,
                                                 tree_lookup=args.tree_lookup, tree_redraft=args.tree_redraft,
                                                 drafter_weights=args.drafter_weights,
                                                 target_what=target_setting(args.target))
        set_threads(args.device, args.threads, args.batch_size, target.model)  # batch 1: one per core for a large target
        check_context_fits(tokenizer, conversations, args.prefills if args.command == "sweep" else [args.prefill_tokens],
                           args.max_new_tokens, max_positions(target))
        workers = cpu_workers(args.device, args.batch_size, args.threads, args.cpu_workers) if args.engine == "ours" else 1
        if args.engine == "ours":
            from infer.batch import check_batchable

            check_batchable(drafter, args.batch_size, target)
        engine = start_engine(args, source, target, drafter, tokenizer) if args.engine != "ours" else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    eos = eos_ids(tokenizer, target.model)
    warmup = getattr(target, "capture", False) if args.warmup is None else args.warmup  # a GPU compiles and captures there
    config = {**vars(args), **source}
    print(f"target {source['target']} | drafter {source['drafter']} | {len(conversations)} prompts -> {out}", file=sys.stderr)
    write_json(out / "settings.json", settings)  # what every turn written here is made with (``check_settings``)
    for warning in [recorded_target_warning(args.target, source.get("run"))] + [window_warning(drafter, w) for w in windows]:
        if warning:
            print(warning, file=sys.stderr)

    pld_summaries: dict[int, dict] = {}
    pld_questions: dict[int, dict] = {}  # per prefill: eval.bootstrap.per_question of prompt lookup's records
    config["engine_drafter"] = getattr(engine, "drafter", None)

    def prompt_lookup(prefill: int) -> dict | None:
        """Prompt lookup's τ on the same prompts and prefill (window-independent: once per prefill)."""
        if not args.pld or isinstance(drafter, PromptLookupDrafter):
            return None
        if prefill not in pld_summaries:
            pld = PromptLookupDrafter(num_draft_tokens=drafter.block_size - 1, vocab_size=target.lm_head.weight.shape[0])
            records = run_conversations(target, pld, tokenizer, conversations, prefill_tokens=prefill, sampling=sampling,
                                        max_new_tokens=args.max_new_tokens, eos_token_ids=eos, baseline=False, batch_size=args.batch_size,
                                        desc=f"prompt lookup, prefill {prefill}", partial=out / "partial" / f"pld_prefill-{prefill}.jsonl",
                                        reuse_prefixes=args.prefix_reuse, workers=workers, warmup=warmup)
            if args.engine != "ours":  # the engine's τ counts each turn's last drafts past the end: so does this one
                records = as_engine_counts(records)
            pld_summaries[prefill] = summarize(records)
            pld_questions[prefill] = per_question(records)
        return pld_summaries[prefill]

    def run_cell(window, prefill: int, baseline: bool):
        cell_drafter = drafter.with_window(window)  # DFlash or EAGLE-3, same kind and settings
        label = "none" if window is None else ("trained" if window == "trained" else str(window))
        records = run_conversations(target, cell_drafter, tokenizer, conversations, prefill_tokens=prefill, sampling=sampling,
                                    max_new_tokens=args.max_new_tokens, eos_token_ids=eos, baseline=baseline,
                                    desc=f"{args.engine}: window {label}, prefill {prefill}", engine=engine, batch_size=args.batch_size,
                                    partial=out / "partial" / f"window-{label}_prefill-{prefill}{'_baseline' if baseline else ''}.jsonl",
                                    reuse_prefixes=args.prefix_reuse, workers=workers, warmup=warmup)
        summary = summarize(records)
        pld = prompt_lookup(prefill)
        if pld is not None:
            summary["prompt_lookup"] = {k: pld[k] for k in ("tau", "acceptance_by_position", "tokens_per_s", "steps", "tau_by_category",
                                                            "steps_without_drafts", "tau_drafting_steps")}
            if args.engine != "ours":
                summary["prompt_lookup_note"] = (f"counted as {args.engine}'s counters count (each turn's last step with the "
                                                 "drafts it accepted past the token budget or end)")
            if not sampling.greedy and any(r.get("turn", 1) > 1 for r in records):  # later turns follow each pass's own answers
                summary["prompt_lookup_note"] = (f"sampled (temperature {sampling.temperature:g}): a later turn's prompt holds "
                                                 "each pass's own sampled answers, so prompt lookup's later turns are other "
                                                 "prompts than the drafter's (first turns are the same)")
        else:  # a table's "-" says why
            summary["prompt_lookup_note"] = ("not run: the drafter is prompt lookup" if isinstance(drafter, PromptLookupDrafter)
                                             else "not run (--no-pld)")
        return label, records, summary

    try:
        if args.command != "sweep":
            baseline = True if args.baseline is None else args.baseline
            label, records, summary = run_cell(windows[0], args.prefill_tokens, baseline)
            write_json(out / "results.json", {"config": config, "summary": summary, "records": records})
            table = summary_table(summary, f"{args.command}: {drafting_label(drafter)}, window {label}, prefill {args.prefill_tokens}")
            with atomic_open(out / "summary.md") as f:
                f.write(table + "\n")
            print(table)
            if args.wandb:
                log_wandb("auto", args.wandb_project, f"{args.command}-w{label}-p{args.prefill_tokens}", config, summary, records,
                          out_dir=out)
            return 0
        cells, texts = {}, {}  # texts: each cell's output ids per turn (did the target's answer change behind the filler?)
        questions = {}  # each cell's per-question pooled steps, for the kept τ's bootstrap interval

        def keep(label: str, prefill: int, summary: dict, records: list[dict]) -> None:
            cells[(label, prefill)] = summary
            texts[(label, prefill)] = {(str(r["id"]), r["turn"]): r["output_ids"] for r in records}
            questions[(label, prefill)] = per_question(records)

        for window in windows:
            for prefill in args.prefills:
                label = "none" if window is None else str(window)
                path = out / "cells" / f"window-{label}_prefill-{prefill}.json"
                if path.exists():  # resumable: a finished cell of the same prompts and passes is not recomputed
                    done = read_cell(path)
                    made_with = {k: done.get("config", {}).get(k) for k in CELL_SETTINGS}
                    if made_with == {k: config.get(k) for k in CELL_SETTINGS}:
                        keep(label, prefill, done["summary"], done["records"])
                        continue
                    # another question count or baseline/prompt-lookup pass (kept apart from settings.json, which holds
                    # what changes the tokens): reused, the sweep mixed prompt sets. Decoded again; the turns its
                    # partial files hold are read back, not decoded
                    print(f"window {label} prefill {prefill}: the cell was made with {made_with}; made again with "
                          f"{ {k: config.get(k) for k in CELL_SETTINGS} }", file=sys.stderr)
                label, records, summary = run_cell(window, prefill, bool(args.baseline))
                # prefill_tokens: the single-cell commands' field (vars(args) holds its unused default), this cell's prefill
                write_json(path, {"config": {**config, "window": label, "prefill": prefill, "prefill_tokens": prefill},
                                  "summary": summary, "records": records})
                keep(label, prefill, summary, records)
                print(f"window {label} prefill {prefill}: tau {summary['tau']:.3f}, {summary['tokens_per_s']:.1f} tok/s", file=sys.stderr)
        for prefill in args.prefills:  # prompt lookup's records for its interval where every cell of a prefill was resumed:
            if (out / "partial" / f"pld_prefill-{prefill}.jsonl").exists():  # read back from its partial file, not decoded again
                prompt_lookup(prefill)
        questions.update({("prompt lookup", p): q for p, q in pld_questions.items()})
        tables = sweep_tables(cells, texts, questions)
        with atomic_open(out / "sweep.md") as f:
            f.write(tables)
        sweep_plot(cells, out / "tau_vs_context.png", f"{Path(source['drafter']).name} on {Path(source['target']).name}")
        print(tables)
        if args.wandb:
            log_wandb("auto", args.wandb_project, "sweep", config, cells=cells, plot=out / "tau_vs_context.png", out_dir=out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
