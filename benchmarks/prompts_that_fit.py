"""Keep the prompts of a JSONL prompt file that fit the target behind a prefill, by ``python -m eval``'s own rule.

    python benchmarks/prompts_that_fit.py --target TARGET --prompts IN.jsonl --prefill 31979 --max-new-tokens 128 \
        --out OUT.jsonl [--shards N]

A sweep refuses a prompt set with one conversation that may not fit (``eval.runner.check_context_fits``: each earlier
answer counted at ``--max-new-tokens`` + 16, plus the new tokens); this writes the lines that pass, in file order,
unchanged, and prints how many. ``--shards N`` also writes ``OUT.shard{i}.jsonl``, N interleaved slices (i::N) of the
kept lines, for one sweep per GPU whose folders ``benchmarks/sweep_kept_ci.py --merge`` reads as one. Only the
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

    try:
        conversations = prompts_file(args.prompts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    limit = int(getattr(AutoConfig.from_pretrained(args.target).get_text_config(), "max_position_embeddings", 1 << 30))
    lines = [line for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == len(conversations)
    kept = []
    for line, conversation in zip(lines, conversations):
        try:
            check_context_fits(tokenizer, [conversation], [args.prefill], args.max_new_tokens, limit)
        except ValueError:
            continue
        kept.append(line)
    files = {Path(args.out): kept}
    if args.shards > 0:
        out = Path(args.out)
        files.update({out.with_suffix(f".shard{i}.jsonl"): kept[i::args.shards] for i in range(args.shards)})
    for path, rows in files.items():
        with atomic_open(path) as f:
            f.write("".join(json.dumps(json.loads(r), ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(kept)} of {len(lines)} prompts fit {limit} positions behind {args.prefill} prefill tokens "
          f"with {args.max_new_tokens} new tokens a turn -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
