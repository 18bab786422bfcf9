"""How full the trainer's rows are: one conversation per row against packed rows (next fit, best fit), on real data.

    python benchmarks/packing_fill.py experiment=eagle3_swa_small target.path=builtin:smollm2-135m-instruct \
        data.path=regenerated.jsonl data.regenerate.enabled=false [--pack-length 2048] [--batch-size 16]

Prepares the training split exactly as ``python -m train`` does with the given overrides (tokenized, held-out rows
removed), then counts, for each way of filling rows of ``--pack-length`` slots (the static shape a GPU step pads to),
the real tokens per step of ``--batch-size`` rows and the share of slots they fill. A GPU step's kernels run over every
slot, padding included, so at equal step time tokens/s scale with the fill (the timed pair is in BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the training config")
    parser.add_argument("--pack-length", type=int, default=None, help="slots per row (default: data.max_length)")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per step (default: trainer.batch_size)")
    args = parser.parse_args()

    import numpy as np

    from benchmarks.train_throughput import compose
    from models.builtin_targets import resolve_target_path
    from models.target import TargetModel
    from train.data import prepare_data
    from train.data.dataset import best_fit_rows, next_fit_rows

    cfg = compose(args.overrides + ["output_dir=/tmp/packing_fill", "data.pack_length=null", "data.pack_documents=false"])
    slots = args.pack_length or cfg.data.max_length
    batch = args.batch_size or cfg.trainer.batch_size
    target = TargetModel.from_pretrained(resolve_target_path(cfg.target.path), "cpu")
    train_ds, _, summary = prepare_data(cfg.data, target, seed=cfg.trainer.seed, progress=False)
    lengths = [len(r) for r in train_ds.with_format(None)["input_ids"]]
    tokens = sum(lengths)
    order = np.random.default_rng(cfg.trainer.seed).permutation(len(lengths)).tolist()
    next_fit = len(next_fit_rows(lengths, slots, order))  # pack_conversations' default, in its seeded order
    best_fit = len(best_fit_rows(lengths, slots, order))
    print(f"{len(lengths):,} training conversations, {tokens:,} tokens (mean {tokens / len(lengths):.0f}, longest {max(lengths):,}); "
          f"rows of {slots:,} slots, {batch} rows a step")
    print("| packing | rows | real tokens per step | slots filled |")
    print("|---|---:|---:|---:|")
    for name, rows in (("one conversation per row (padded to the row)", len(lengths)), ("packed, next fit in a seeded order (data.pack_length)", next_fit),
                       ("packed documents, best fit decreasing (data.pack_documents)", best_fit)):
        print(f"| {name} | {rows:,} | {tokens / rows * batch:,.0f} | {100 * tokens / (rows * slots):.1f}% |")


if __name__ == "__main__":
    main()
