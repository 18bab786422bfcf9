"""Keep the prompts of a JSONL prompt file that fit the target behind a prefill, by ``python -m eval``'s own rule.

    python benchmarks/prompts_that_fit.py --target TARGET --prompts IN.jsonl --prefill 31979 --max-new-tokens 128 \
        --out OUT.jsonl [--shards N]

A sweep refuses a prompt set with one conversation that may not fit (``eval.runner.check_context_fits``: each earlier
answer counted at ``--max-new-tokens`` + 16, plus the new tokens); this writes the records that pass, in file order,
and prints how many. ``--shards N`` also writes ``OUT.shard{i}.jsonl``, N interleaved slices (i::N) of the
kept lines, for one sweep per GPU whose folders ``benchmarks/sweep_kept_ci.py --merge`` reads as one. Each kept record
keeps the id eval gives it in the whole file (its line number where it has none), so shards keep distinct ids. Only the
tokenizer and config are read (no weights). Each file is written under a temporary name, then renamed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.atomic import atomic_open  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="a Hugging Face folder or id (its tokenizer and config)")
    p.add_argument("--prompts", required=True)
    p.add_argument("--prefill", type=int, required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shards", type=int, default=0)
    args = p.parse_args()
    from transformers import AutoConfig, AutoTokenizer

    from eval.runner import check_context_fits
    from infer.prompts import prompts_file

    if args.prefill < 0 or args.max_new_tokens < 1:
        print(f"error: --prefill {args.prefill} --max-new-tokens {args.max_new_tokens}; expected a prefill >= 0 and new "
              "tokens >= 1", file=sys.stderr)
        return 2
    try:
        conversations = prompts_file(args.prompts)
        tokenizer = AutoTokenizer.from_pretrained(args.target)
        limit = int(getattr(AutoConfig.from_pretrained(args.target).get_text_config(), "max_position_embeddings", 1 << 30))
    except (OSError, ValueError) as e:  # the prompt file's one-line errors; a target folder that is not one
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    # the records as prompts_file read them (its encoding, its lines: str.splitlines also splits at U+2028 inside a JSON
    # string), each written with the id eval gave it (its line number where the record has none: the kept file and its
    # shards renumbered the questions, so shards shared ids and --merge refused them)
    with open(args.prompts, encoding="utf-8-sig") as f:
        records = [json.loads(line) for line in f if line.strip()]
    kept = []
    for record, conversation in zip(records, conversations, strict=True):
        try:
            check_context_fits(tokenizer, [conversation], [args.prefill], args.max_new_tokens, limit)
        except ValueError as e:
            if "may need" not in str(e):  # the one refusal that means "does not fit"
                raise
            continue
        kept.append(json.dumps({**record, "id": conversation.id}, ensure_ascii=False))
    files = {Path(args.out): kept}
    if args.shards > 0:
        out = Path(args.out)
        files.update({out.with_suffix(f".shard{i}.jsonl"): kept[i::args.shards] for i in range(args.shards)})
    for path, rows in files.items():
        with atomic_open(path) as f:
            f.write("".join(r + "\n" for r in rows))
    print(f"{len(kept)} of {len(records)} prompts fit {limit} positions behind {args.prefill} prefill tokens "
          f"with {args.max_new_tokens} new tokens a turn -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
