"""``python -m infer --target PATH --drafter PATH --prompt "..."``: generate, print the text and the statistics.

Examples:
    python -m infer --target ../shared/targets/qwen3-27m-sharegpt --drafter outputs/run/export --question 81 --prefill-tokens 8192
    python -m infer --target builtin:tiny-qwen3 --drafter outputs/tiny/export --prompt "Hello" --baseline --window none
    python -m infer --target ../shared/targets/qwen3-27m-sharegpt --drafter outputs/e3/export --question 81 --tree-topk 8 --tree-tokens 48
    python -m infer --drafter outputs/run --prompts my.jsonl --batch-size 16    # many prompts in flight (first user turns)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.cli_help import DefaultsHelpFormatter



def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m infer", description=__doc__.splitlines()[0],
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("--target", help="HF causal LM folder or id, or builtin:NAME (models/builtin_targets.py; an unknown name "
                                    "is refused with the list) (default: the target recorded in --drafter's run folder)")
    p.add_argument("--drafter", help="a training run folder (python -m train's output_dir), an exported DFlash or EAGLE-3 "
                                     "drafter (a folder or a hub id), or 'pld' (prompt lookup); leave out for plain autoregressive decoding")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the user message")
    src.add_argument("--question", type=int, help="an MT-Bench question_id (first turn), from the bundled copy")
    src.add_argument("--prompts", help="a JSONL file of prompts ({prompt} / {turns} / {messages}: each record's first user turn)")
    p.add_argument("--batch-size", type=int, default=1, help="--prompts: prompts decoded at once (each row's tokens and acceptance "
                                                             "are batch 1's; DFlash and EAGLE-3 blocks, chains and trees, prompt lookup or the target alone)")
    p.add_argument("--prefill-tokens", type=int, default=0, help="filler tokens placed before the question (long-context runs)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", default="trained", help="drafter window at inference: trained | none | W")
    p.add_argument("--draft-steps", type=int, help="EAGLE-3: chain length (tree depth); default the drafter's ttt_length. DFlash chains: the first N drafts of its block verified (default all)")
    p.add_argument("--tree-topk", type=int, help="dynamic tree drafting (EAGLE-3: EAGLE-2's trees; DFlash: over its block's marginals), "
                                                  "top-k children per node and nodes expanded per depth (greedy only)")
    p.add_argument("--tree-tokens", type=int, help="dynamic tree drafting (EAGLE-3, DFlash): nodes verified per step")
    p.add_argument("--tree-lookup", type=int, default=0, help="trees: prompt lookup's chain of up to N drafts joins each tree "
                                                               "as one more branch (hybrid drafting; default 0: none)")
    p.add_argument("--tree-redraft", type=int, default=0, help="DFlash trees: the nodes expanded at depths 1 .. N are drafted again "
                                                                "with their path in place (a drafter trained with drafter.reveal_prob)")
    p.add_argument("--drafter-weights", default="model", choices=["model", "int8"],
                   help="the drafter's matrices as loaded, or weight-only int8 copies (DFlash: and of the LM head it drafts with; "
                        "on a GPU faster up to 16-32 rows a product, DFlash's being batch x block, slower past 64)")
    p.add_argument("--backend", default="sdpa", choices=["sdpa", "flashinfer"])
    p.add_argument("--device", default="auto", help="auto = cuda when there is a GPU, else cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument("--threads", type=int, help="CPU threads (default on CPU: one per core when batched, or for a target of 10M "
                                               "parameters or more; 1 for a smaller one, whose decoding runs faster on one)")
    p.add_argument("--baseline", action="store_true", help="also run autoregressive decoding and report the speedup")
    p.add_argument("--pld", action=argparse.BooleanOptionalAction, default=True,
                   help="with a trained drafter, also decode the same prompt(s) with prompt lookup (as many drafts a step as "
                        "the drafter's block) and print its tau beside the drafter's")
    p.add_argument("--json", help="write the statistics here as JSON")
    return p.parse_args(argv)


NO_TAU = "n/a (no verify step)"


def tau_text(tau: float | None) -> str:
    """τ as printed: three decimals, or ``NO_TAU`` for None. With no verify step (the prefill's token the whole output:
    ``--max-new-tokens 1``, an end-of-sequence token first) τ, a mean over verify steps, is undefined; it printed as
    "tau 0.000", below any real τ (>= 1), and the JSON held 0.0 (now null)."""
    return NO_TAU if tau is None else f"{tau:.3f}"


def stats_table(name: str, gen) -> str:
    s = gen.stats
    acc = (" ".join(f"{a:.2f}" for a in s.acceptance_by_position) or "-") if s.steps else "-"
    return "\n".join([
        f"[{name}] prompt {s.prompt_tokens} tok | new {s.new_tokens} tok | steps {s.steps} | tau {tau_text(s.tau_or_none)} | "
        f"{s.tokens_per_s:.1f} tok/s",
        f"[{name}] time: prefill {s.prefill_s:.3f}s | draft {s.draft_s:.3f}s | verify {s.verify_s:.3f}s | other {s.other_s:.3f}s",
        f"[{name}] acceptance by position: {acc}",
    ])


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def run(args: argparse.Namespace) -> int:
    # heavy imports after argument parsing: --help and argument errors answer at once
    from infer.generate import generate
    from infer.loading import PROMPT_LOOKUP, check_backend, eos_ids, load_models, parse_window, recorded_target_warning, resolve_device, resolve_run, set_threads, target_setting, window_warning
    from infer.prompts import long_prompt_ids, mt_bench_questions, prompts_file
    from models.sampling import sampling_from_flags
    from common.atomic import unwritable_reason

    if args.batch_size < 1 or (args.batch_size > 1 and args.prompts is None):
        print(f"error: --batch-size {args.batch_size}; expected >= 1, and above 1 only with --prompts FILE", file=sys.stderr)
        return 2
    try:
        args.device = resolve_device(args.device)
        check_backend(args.backend, args.device)
        set_threads(args.device, args.threads, args.batch_size if args.prompts else 1)
        if args.prompt is not None and not args.prompt.strip():
            raise ValueError(f"--prompt {args.prompt!r} is empty; expected the user message")
        if args.max_new_tokens < 1:  # before the models load (the loop said so after)
            raise ValueError(f"--max-new-tokens {args.max_new_tokens}; expected >= 1")
        if args.json and (Path(args.json).is_dir() or any(p.is_file() for p in Path(args.json).parents)):
            raise ValueError(f"--json {args.json}: {'a folder' if Path(args.json).is_dir() else 'a file stands in its path'}; "
                             "expected a file path to write the statistics to")
        reason = unwritable_reason(args.json) if args.json else None  # before decoding: the write failed with a traceback after it
        if reason:
            raise ValueError(f"--json {args.json}: {reason}; expected a file path the statistics can be written to")
        if args.prefill_tokens < 0:  # was "prefill_tokens=-1" after the target loaded
            raise ValueError(f"--prefill-tokens {args.prefill_tokens}; expected >= 0 (filler tokens before the question)")
        window = parse_window(args.window)
        if args.drafter == PROMPT_LOOKUP and window != "trained":  # was ignored, rc 0 (eval's sweeps run pld under any window)
            raise ValueError(f"--window {args.window} sets a trained drafter's attention window; prompt lookup (--drafter pld) "
                             "has none: leave it out")
        sampling = sampling_from_flags(args.temperature, args.top_k, args.top_p, args.seed)
        # the prompts file read before any model loads (an 8B target takes a minute to load before a typo surfaced)
        conversations = prompts_file(args.prompts) if args.prompts is not None else None
        target_path, drafter_path, run_dir = resolve_run(args.target, args.drafter)
        if target_path is None:
            raise ValueError("--target is required unless --drafter is a training run folder (which records its target)")
        target, drafter, tokenizer = load_models(target_path, drafter_path, args.device, args.dtype, window, args.backend,
                                                 draft_steps=args.draft_steps, tree_topk=args.tree_topk, tree_tokens=args.tree_tokens,
                                                 tree_lookup=args.tree_lookup, tree_redraft=args.tree_redraft,
                                                 drafter_weights=args.drafter_weights,
                                                 target_what=target_setting(args.target))
        set_threads(args.device, args.threads, args.batch_size if args.prompts else 1, target.model)  # batch 1: one per core for a large target
        for warning in (recorded_target_warning(args.target, run_dir), window_warning(drafter, window)):
            if warning:
                print(warning, file=sys.stderr)
        if conversations is not None:
            return run_many(args, conversations, target, drafter, tokenizer, sampling)
        if args.question is not None:
            by_id = {q["question_id"]: q for q in mt_bench_questions()}
            if args.question not in by_id:
                raise ValueError(f"--question {args.question}: no such MT-Bench question_id (81..160)")
            text = by_id[args.question]["turns"][0]
        else:
            text = args.prompt
        prompt = long_prompt_ids(tokenizer, text, args.prefill_tokens)
        check_fits([("the prompt", len(prompt))], args, target)
        eos = eos_ids(tokenizer, target.model)
        result = generate(target, drafter, prompt, args.max_new_tokens, sampling, eos)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(tokenizer.decode(result.tokens))
    print(stats_table("speculative" if drafter else "autoregressive", result), file=sys.stderr)
    report = {"speculative" if drafter else "autoregressive": result.stats.to_dict()}
    pld, note = prompt_lookup_beside(args, target, drafter)
    if pld is not None:  # the free baseline on the same prompt, beside the drafter's tau
        lookup = generate(target, pld, prompt, args.max_new_tokens, sampling, eos)
        print(f"[prompt lookup] tau {tau_text(lookup.stats.tau_or_none)} on the same prompt ({pld.num_draft_tokens} drafts a "
              f"step; the drafter's {tau_text(result.stats.tau_or_none)})", file=sys.stderr)
        report["prompt_lookup"] = lookup.stats.to_dict()
    elif note:
        print(f"[prompt lookup] {note}", file=sys.stderr)
    if args.baseline and drafter is not None:
        base = generate(target, None, prompt, args.max_new_tokens, sampling, eos)
        print(stats_table("autoregressive", base), file=sys.stderr)
        # no token decoded past the prefill's (max_new_tokens 1, or an end at once): no speed, no speedup (null), not 0.00x
        speedup = (result.stats.tokens_per_s / base.stats.tokens_per_s
                   if result.stats.tokens_per_s and base.stats.tokens_per_s else None)
        shown = "n/a (no token decoded past the prefill's)" if speedup is None else f"{speedup:.2f}x"
        print(f"speedup {shown} | identical output: {base.tokens == result.tokens}", file=sys.stderr)
        report["autoregressive"] = base.stats.to_dict()
        report["speedup"] = speedup
    if args.json:
        from common.atomic import atomic_open

        with atomic_open(args.json) as f:
            json.dump(report, f, indent=2)
    return 0


def check_fits(prompts: list[tuple[str, int]], args: argparse.Namespace, target) -> None:
    """Refuse, before decoding, a prompt (named, with its token count) whose new tokens would run past the target's
    positions (a 40K-token prompt on a 32K target decoded for minutes and exited 0)."""
    limit = int(getattr(target.model.config.get_text_config(), "max_position_embeddings", 1 << 30))
    for name, n in prompts:
        if n + args.max_new_tokens > limit:
            raise ValueError(f"{name}: {n} prompt tokens (--prefill-tokens {args.prefill_tokens} of them filler) + "
                             f"{args.max_new_tokens} new tokens exceed the target's max_position_embeddings={limit}; "
                             "lower --prefill-tokens or --max-new-tokens")


def prompt_lookup_beside(args: argparse.Namespace, target, drafter) -> tuple[object | None, str | None]:
    """(prompt lookup to decode the same prompt(s) with, beside a trained drafter (``--pld``, the default): as many drafts
    a step as the drafter's block, eval's rule; or None and, with ``--no-pld``, the line saying so). None for plain
    decoding and for prompt lookup itself (its own tau is the one printed)."""
    from infer.prompt_lookup import PromptLookupDrafter

    if drafter is None or isinstance(drafter, PromptLookupDrafter):
        return None, None
    if not args.pld:
        return None, "not run (--no-pld)"
    return PromptLookupDrafter(num_draft_tokens=drafter.block_size - 1, vocab_size=target.lm_head.weight.shape[0]), None


def pooled_tau(results) -> tuple[float | None, list[int]]:
    """(τ over every verify step of ``results``, None when there was none; those steps' accepted counts)."""
    from infer.generate import pooled_acceptance

    steps = [a for r in results for a in r.stats.accepted_per_step]
    return (pooled_acceptance(steps, 1)[0] if steps else None), steps


def run_many(args: argparse.Namespace, conversations, target, drafter, tokenizer, sampling) -> int:
    """``--prompts`` (``conversations``, its records): every record's first user turn, ``--batch-size`` in flight; each output,
    then the pooled numbers."""
    import time

    from infer.batch import check_batchable, generate_batch
    from infer.generate import generate, trees_on_rows
    from infer.loading import eos_ids
    from infer.prompts import long_prompt_ids

    check_batchable(drafter, args.batch_size, target)
    prompts = [long_prompt_ids(tokenizer, c.turns[0], args.prefill_tokens) for c in conversations]
    check_fits([(f"record {c.id}", len(p)) for c, p in zip(conversations, prompts)], args, target)
    eos = eos_ids(tokenizer, target.model)

    def decode_all(d) -> list:
        if args.batch_size == 1 and not trees_on_rows(d):  # any target and drafter (FlashInfer attention), one prompt after another
            return [generate(target, d, p, args.max_new_tokens, sampling, eos) for p in prompts]
        return generate_batch(target, d, prompts, args.max_new_tokens, batch_size=args.batch_size, sampling=sampling, eos_token_ids=eos)

    start = time.perf_counter()
    results = decode_all(drafter)
    seconds = time.perf_counter() - start
    for conversation, result in zip(conversations, results):
        print(f"### {conversation.id}\n{tokenizer.decode(result.tokens)}")
    new = sum(len(r.tokens) for r in results)
    tau, steps = pooled_tau(results)
    print(f"{len(results)} prompts, batch size {args.batch_size} | new {new} tok in {seconds:.2f}s: {new / seconds:.1f} tok/s | "
          f"tau {tau_text(tau)} over {len(steps)} steps", file=sys.stderr)
    (pld, note), pld_tau = prompt_lookup_beside(args, target, drafter), None
    if pld is not None:  # the free baseline on the same prompts, decoded the same way
        lookups = decode_all(pld)
        pld_tau, pld_steps = pooled_tau(lookups)
        print(f"prompt lookup on the same prompts ({pld.num_draft_tokens} drafts a step): tau {tau_text(pld_tau)} over "
              f"{len(pld_steps)} steps (the drafter's {tau_text(tau)})", file=sys.stderr)
    elif note:
        print(f"prompt lookup: {note}", file=sys.stderr)
    if args.json:
        from common.atomic import atomic_open

        report = {"prompts": len(results), "batch_size": args.batch_size, "new_tokens": new, "seconds": seconds, "tau": tau,
                  "prompt_lookup_tau": pld_tau,
                  "per_prompt": [{"id": c.id, **r.stats.to_dict()} for c, r in zip(conversations, results)]}
        with atomic_open(args.json) as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
