"""Our training data in the format vLLM speculators' (0.9.0) trainer reads, to train a peer drafter on the
same target, the same rows (regenerated when the experiment regenerates) and the same number of samples.

    python -m train.data.speculators_export rows OUT experiment=dflash_swa_small [key=value ...]
    speculators prepare-data --model TARGET --data OUT/rows.jsonl --output OUT/prepared --seq-length L --seed 0
    python -m train.data.speculators_export hidden-states OUT experiment=dflash_swa_small [key=value ...]
    speculators train --data-path OUT/prepared --on-missing raise ...     (OUT/export.json holds the full commands)

``rows`` takes the experiment's Hydra config, builds the data exactly as ``python -m train`` does
(``train.data.prepare_data``: read, regenerate, tokenize with our loss masks, hold out ``data.num_eval``) and
writes ``OUT/rows.jsonl`` (``{"input_ids", "loss_mask"}`` per line) and ``OUT/export.json`` (counts, layer
ids, the speculators commands). ``hidden-states`` runs the target over every row of prepare-data's output
and writes ``OUT/prepared/hidden_states/hs_{i}.safetensors``. Both write each file under a temporary name
and rename it; ``hidden-states`` skips files already there, so a killed run is finished by the same command.

What speculators 0.9.0 does with the files (site-packages/speculators, read for this module):

- prepare-data passes rows that hold ``input_ids`` and ``loss_mask`` through unchanged: no chat template, no
  re-tokenizing (data_generation/preprocessing.py ``_preprocess_batch`` -> ``_passthrough_pretokenized`` ->
  ``_append_row``: clipped to ``--seq-length``, a row without a loss token dropped, columns ``input_ids``,
  ``loss_mask``, ``seq_len``). It shuffles twice with ``--seed``: each file (``raw_dataset.shuffle(seed=seed)``)
  and the concatenation (``combined_dataset.shuffle(seed=seed)``), in ``load_and_preprocess_dataset``.
- the trainer's ``ArrowDataset`` (train/data.py) keeps prepared rows ``[0, int(N * train_data_ratio))`` for
  training and the rest for validation, and reads row i's hidden states from
  ``<data-path>/hidden_states/hs_{i}.safetensors`` (hs_connectors/transfer.py ``FileTransfer.get_cached``):
  ``{"hidden_states": [S, n_aux + 1, H], "token_ids": [S]}``. ``token_ids`` must equal the row's
  ``input_ids`` (else the sample is dropped with a warning); slots ``[:, :-1]`` flattened are the drafter's
  features ``[S, n_aux * H]``, slot ``-1`` is ``verifier_last_hidden_states``, to which the model applies its
  frozen ``verifier_norm`` (models/eagle3/core.py, models/dflash/core.py): the last decoder layer's output
  *before* the final norm.

So ``rows.jsonl`` is written in the order prepare-data's two shuffles undo: prepared row j is our row j, our
train rows first and our held-out rows after them, and ``--train-data-ratio (n_train + 0.5) / N`` makes
speculators' validation split our eval split. The permutation is taken from ``datasets.Dataset.shuffle``
itself (``prepared_order``), and tests/test_speculators_export.py runs speculators' own prepare-data on the
file to check it.

Layer ids (train/engines.py): ours, id i = output of decoder layer i = HF ``hidden_states[i + 1]``;
speculators' ``--target-layer-ids`` are vLLM's, id k = *input* of decoder layer k = HF ``hidden_states[k]``,
with id ``num_layers`` the final hidden state (models/utils.py ``resolve_target_layer_ids``). Hence
speculators id = ours + 1 for every slot, the last slot included: it is our id L - 1 (the last layer's
output, unnormed), speculators id L. HF's ``hidden_states[L]`` is *after* the final norm, so the slots are
taken with forward hooks on the decoder layers, not from ``output_hidden_states``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch

from common.atomic import atomic_open
from train.engines import engine_layer_ids

from .readers import DataError

log = logging.getLogger(__name__)

ROWS_FILE = "rows.jsonl"
MANIFEST_FILE = "export.json"
PREPARED_DIR = "prepared"  # prepare-data's --output, as the printed commands name it
HIDDEN_STATES_DIR = "hidden_states"  # speculators' default: <data-path>/hidden_states (hs_connectors FileBackend)


def to_speculators_layer_ids(layer_ids: list[int]) -> list[int]:
    """Our ids (output of layer i = HF hidden_states[i + 1]) -> vLLM's / speculators' (input of layer k = HF hidden_states[k])."""
    return engine_layer_ids(layer_ids, "speculators")  # the one offset table: train/engines.py


def hidden_state_layer_ids(layer_ids: list[int], num_layers: int) -> list[int]:
    """Our ids of the slots of one ``hs_{i}`` file: the drafter's layers, then the last layer's output (pre-norm)."""
    return [*layer_ids, num_layers - 1]


def prepared_order(num_rows: int, seed: int) -> list[int]:
    """Row j of prepare-data's output is row ``order[j]`` of its input file (one file, no ``--max-samples``):
    the same two ``Dataset.shuffle(seed=seed)`` calls as ``load_and_preprocess_dataset``, on an index column."""
    import datasets

    index = datasets.Dataset.from_dict({"i": list(range(num_rows))})
    return index.shuffle(seed=seed).shuffle(seed=seed)["i"]


def rows_in_file_order(rows: list[dict[str, list[int]]], seed: int) -> list[dict[str, list[int]]]:
    """The order to write ``rows`` in so that prepare-data, shuffling with ``seed``, gives them back in order."""
    order = prepared_order(len(rows), seed)
    in_file: list[dict[str, list[int]] | None] = [None] * len(rows)
    for j, i in enumerate(order):
        in_file[i] = rows[j]
    return in_file  # type: ignore[return-value]


def train_data_ratio(num_train: int, num_rows: int) -> float:
    """``--train-data-ratio`` whose ``int(N * ratio)`` (speculators' split) is ``num_train``, half a row from either edge."""
    ratio = (num_train + 0.5) / num_rows
    assert int(num_rows * ratio) == num_train, (num_train, num_rows)
    return ratio


def ordered_rows(train_ds: Any, eval_ds: Any) -> list[dict[str, list[int]]]:
    """Our train rows, then our eval rows, as plain ``{"input_ids", "loss_mask"}`` lists of ints."""
    rows = []
    for ds in (train_ds, eval_ds):
        for r in ds.with_format(None) if ds is not None else ():
            rows.append({"input_ids": [int(t) for t in r["input_ids"]], "loss_mask": [int(m) for m in r["loss_mask"]]})
    return rows


def write_rows_jsonl(rows: list[dict[str, list[int]]], path: Path, seed: int) -> str:
    """Write ``rows`` (temp name, then rename) in prepare-data's inverse shuffle order; returns the file's sha256."""
    digest = hashlib.sha256()
    with atomic_open(path) as f:
        for row in rows_in_file_order(rows, seed):
            line = json.dumps(row, separators=(",", ":")) + "\n"
            digest.update(line.encode())
            f.write(line)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- hidden states

@torch.no_grad()
def layer_outputs(target: Any, input_ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """The outputs of decoder layers ``layer_ids`` (our ids; ``num_layers - 1`` = the last one, before the final norm).

    Args:
        target: a ``models.target.TargetModel``.
        input_ids: [S] token ids of one row (no padding).
        layer_ids: our layer ids, 0 .. num_layers - 1.

    Returns:
        ``[S, len(layer_ids), H]`` in the target's dtype, on the CPU.
    """
    captured: dict[int, torch.Tensor] = {}

    def hook_for(layer_id: int):
        def hook(module, args, output) -> None:
            captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    handles = [target.layers[i].register_forward_hook(hook_for(i)) for i in set(layer_ids)]
    try:
        target.stack(input_ids=input_ids[None].to(target.device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.stack([captured[i][0] for i in layer_ids], dim=1).cpu()


def check_prepared(prepared: Any, rows: list[dict[str, list[int]]], where: str) -> None:
    """prepare-data's rows must be ours, in our order (else the hidden states would belong to other rows)."""
    if len(prepared) != len(rows):
        raise DataError(f"{where}: {len(prepared)} rows, the export has {len(rows)}; run prepare-data on its rows.jsonl "
                        "with the --seed and --seq-length of export.json, without --max-samples or --minimum-valid-tokens")
    prepared = prepared.with_format(None)
    for j, row in enumerate(rows):
        got = prepared[j]
        if list(got["input_ids"]) != row["input_ids"] or list(got["loss_mask"]) != row["loss_mask"]:
            raise DataError(f"{where}: row {j} is not the export's row {j}; run prepare-data on its rows.jsonl with the --seed "
                            "and --seq-length of export.json")


def write_hidden_states(target: Any, prepared_dir: Path, rows: list[dict[str, list[int]]], layer_ids: list[int],
                        progress: bool = True) -> dict[str, int]:
    """``prepared_dir/hidden_states/hs_{i}.safetensors`` for every prepared row i (existing files are kept).

    Each file: ``hidden_states [S, len(layer_ids) + 1, H]`` (target dtype; the drafter's layers in order, then the
    last layer's output before the final norm) and ``token_ids [S]`` (int64, = the prepared row's ``input_ids``).
    """
    import datasets
    from safetensors.torch import save
    from tqdm.auto import tqdm

    prepared_dir = Path(prepared_dir)
    if not (prepared_dir / "dataset_info.json").exists():
        raise DataError(f"{prepared_dir}: no prepare-data output there (dataset_info.json missing); run `speculators prepare-data "
                        f"... --output {prepared_dir}` first (OUT/export.json has the command)")
    check_prepared(datasets.load_from_disk(str(prepared_dir)), rows, str(prepared_dir))
    slots = hidden_state_layer_ids(layer_ids, target.num_layers)
    out = prepared_dir / HIDDEN_STATES_DIR
    out.mkdir(exist_ok=True)
    written = tokens = 0
    for i, row in enumerate(tqdm(rows, desc="hidden states", unit="row", disable=not progress)):
        path = out / f"hs_{i}.safetensors"
        if path.exists():
            continue
        token_ids = torch.tensor(row["input_ids"], dtype=torch.long)
        hidden = layer_outputs(target, token_ids, slots)
        with atomic_open(path, "wb") as f:
            f.write(save({"hidden_states": hidden.contiguous(), "token_ids": token_ids}))
        written += 1
        tokens += len(token_ids)
    return {"rows": len(rows), "written": written, "skipped": len(rows) - written, "tokens": tokens}


# ----------------------------------------------------------------------------- the run's settings

def samples_seen(cfg: Any, num_train: int) -> int:
    """Rows our trainer draws on one process (``train.trainer.build``'s schedule: max_steps x batch_size x grad_accum)."""
    tc = cfg.trainer
    batches_per_epoch = max(1, num_train // tc.batch_size)
    steps_per_epoch = math.ceil(batches_per_epoch / tc.grad_accum)
    max_steps = tc.max_steps
    if tc.num_epochs is not None:
        by_epochs = max(1, math.ceil(tc.num_epochs * steps_per_epoch))
        max_steps = by_epochs if max_steps is None else min(max_steps, by_epochs)
    return max_steps * tc.batch_size * tc.grad_accum


def speculators_commands(cfg: Any, manifest: dict[str, Any], out: Path) -> dict[str, str]:
    """The prepare-data and train commands for this export (``speculators train`` flags are TrainConfig field names)."""
    d, tc = cfg.drafter, cfg.trainer
    target, prepared = manifest["target"], out / PREPARED_DIR
    kind = d.kind
    prepare = (f"speculators prepare-data --model {target} --data {out / ROWS_FILE} --output {prepared} "
               f"--seq-length {manifest['seq_length']} --seed {manifest['seed']}")
    if kind == "eagle3":
        prepare += " --no-skip-token-freq"  # the draft vocabulary is picked from prepare-data's token_freq.pt
    layer_types = d.resolved_layer_types()
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    train = [
        f"speculators train --verifier-name-or-path {target} --data-path {prepared} --speculator-type {kind}",
        f"--on-missing raise --train-data-ratio {manifest['train_data_ratio']!r} --seed {tc.seed}",
        f"--target-layer-ids {' '.join(map(str, manifest['speculators_layer_ids']))} --mask-token-id {manifest['mask_token_id']}",
        # no window (every layer full): the indices say so; "--sliding-window None" is no int to its parser
        f"--num-layers {d.num_hidden_layers}" + (f" --sliding-window {d.sliding_window}" if d.sliding_window is not None else "")
        + (f" --full-attention-indices {' '.join(map(str, full))}" if full else "")
        # its sliding layers are causal inside the block unless told (full layers bidirectional either way), as ours
        + (" --sliding-window-non-causal" if kind == "dflash" and not d.sliding_block_causal else ""),
        # one packed sequence per step of our batch's token budget; epochs = our samples / our train rows
        f"--total-seq-len {tc.batch_size * tc.grad_accum * cfg.data.longest_row} --epochs {manifest['speculators_epochs']}",
        f"--lr {tc.lr!r} --scheduler-type cosine --scheduler-warmup-ratio {tc.warmup_ratio!r}",
    ]
    if kind == "dflash":
        train.append(f"--block-size {d.block_size} --max-anchors {d.num_anchors * tc.batch_size * tc.grad_accum}"
                     + (f" --draft-vocab-size {manifest['draft_vocab_size']}" if d.draft_vocab_size else ""))
    else:
        train.append(f"--ttt-steps {d.ttt_length} --draft-vocab-size {manifest['draft_vocab_size']}")
    train.append(f"--save-path {out / ('speculators_' + kind)}")
    return {"prepare_data": prepare, "train": " \\\n    ".join(train)}


def export_rows(cfg: Any, out: Path) -> dict[str, Any]:
    """Stage 1: ``OUT/rows.jsonl`` and ``OUT/export.json`` for the experiment ``cfg`` (composed Hydra config or TrainConfig)."""
    from models.builtin_targets import resolve_target_path
    from models.target import TargetModel

    from ..dflash import resolve_mask_token_id
    from ..trainer import check_paths, pick_device, target_layer_ids, to_train_config
    from . import prepare_data

    cfg = to_train_config(cfg)
    if cfg.data.pack_fresh_fraction:
        raise DataError(f"data.pack_fresh_fraction={cfg.data.pack_fresh_fraction}: speculators' trainer reads every row whole (its "
                        "hidden states too), so the rows our target reads in pieces cannot be exported as such; "
                        "export with data.pack_fresh_fraction=0")
    if cfg.data.pack_documents:
        raise DataError("data.pack_documents=true: speculators' trainer reads every exported row whole, so a row's documents "
                        "would see each other; export the conversations one per row (data.pack_documents=false, data.pack_length=null)")
    check_paths(cfg)
    out = Path(out)
    target_path = resolve_target_path(cfg.target.path)
    target = TargetModel.from_pretrained(target_path, pick_device(cfg.trainer.device), cfg.target.dtype, cfg.target.attn_implementation)
    layer_ids = target_layer_ids(cfg, target)
    train_ds, eval_ds, summary = prepare_data(cfg.data, target, seed=cfg.trainer.seed, progress=cfg.trainer.progress)
    if eval_ds is None:
        raise DataError("speculators' trainer needs a validation split (--train-data-ratio < 1) and this run holds out no "
                        f"conversation (data.num_eval={cfg.data.num_eval}, at most a tenth of {len(train_ds)} rows); set data.num_eval > 0 "
                        "or use more data")
    rows = ordered_rows(train_ds, eval_ds)
    seed = cfg.trainer.seed
    sha256 = write_rows_jsonl(rows, out / ROWS_FILE, seed)
    seen = samples_seen(cfg, len(train_ds))
    # seq_length: the longest row, so prepare-data keeps packed rows (data.pack_length) whole rather than cutting them
    manifest: dict[str, Any] = {
        "target": str(target_path), "drafter": cfg.drafter.kind, "rows": len(rows), "train_rows": len(train_ds),
        "eval_rows": len(eval_ds), "seed": seed, "seq_length": cfg.data.longest_row,
        "train_data_ratio": train_data_ratio(len(train_ds), len(rows)),
        "our_samples_seen": seen, "speculators_epochs": max(1, round(seen / len(train_ds))),
        "layer_ids": layer_ids, "speculators_layer_ids": to_speculators_layer_ids(layer_ids),
        "hidden_state_slots": to_speculators_layer_ids(hidden_state_layer_ids(layer_ids, target.num_layers)),
        "mask_token_id": resolve_mask_token_id(getattr(cfg.drafter, "mask_token_id", None), target),
        "draft_vocab_size": min(getattr(cfg.drafter, "draft_vocab_size", 0) or target.vocab_size, target.vocab_size),
        "rows_sha256": sha256, "data": {k: v for k, v in summary.items() if k != "read"},
    }
    manifest["commands"] = speculators_commands(cfg, manifest, out)
    with atomic_open(out / MANIFEST_FILE) as f:
        json.dump(manifest, f, indent=2, default=str)
    return manifest


def read_rows(out: Path) -> tuple[dict[str, Any], list[dict[str, list[int]]]]:
    """The manifest and our rows in our order (train, then eval) from an ``export_rows`` folder."""
    out = Path(out)
    if not (out / MANIFEST_FILE).exists() or not (out / ROWS_FILE).exists():
        raise DataError(f"{out}: no {MANIFEST_FILE} / {ROWS_FILE}; run `python -m train.data.speculators_export rows {out} ...` first")
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    lines = (out / ROWS_FILE).read_bytes()
    if hashlib.sha256(lines).hexdigest() != manifest["rows_sha256"]:
        raise DataError(f"{out / ROWS_FILE}: sha256 differs from {MANIFEST_FILE}'s; the file was changed after the export")
    in_file = [json.loads(line) for line in lines.decode().splitlines()]
    return manifest, [in_file[i] for i in prepared_order(len(in_file), manifest["seed"])]


def export_hidden_states(cfg: Any, out: Path, prepared_dir: Path | None = None) -> dict[str, int]:
    """Stage 2: the target's hidden states for every row of prepare-data's output (default ``OUT/prepared``)."""
    from models.builtin_targets import resolve_target_path
    from models.target import TargetModel

    from ..trainer import pick_device, target_layer_ids, to_train_config

    cfg = to_train_config(cfg)
    manifest, rows = read_rows(out)
    target = TargetModel.from_pretrained(resolve_target_path(cfg.target.path), pick_device(cfg.trainer.device), cfg.target.dtype,
                                         cfg.target.attn_implementation)
    layer_ids = target_layer_ids(cfg, target)
    if layer_ids != manifest["layer_ids"]:
        raise DataError(f"drafter layer ids {layer_ids} differ from the export's {manifest['layer_ids']}: pass the overrides given to `rows`")
    return write_hidden_states(target, Path(prepared_dir or Path(out) / PREPARED_DIR), rows, layer_ids, cfg.trainer.progress)


def check_out(stage: str, out: Path) -> None:
    """OUT is a folder, or a path one can be made at (``rows`` writes it): a file there, or a folder that cannot be made,
    failed with a traceback at the first write, after the target loaded and the data was tokenised."""
    blocked = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise DataError(f"OUT {out}: {blocked} is a file; expected an export folder (new, or the one `rows` wrote)")
    if stage == "rows":
        from common.atomic import unwritable_reason

        reason = unwritable_reason(out)
        if reason:
            raise DataError(f"OUT {out}: {reason}; expected an export folder that can be written")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.data.speculators_export", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["rows", "hidden-states"])
    parser.add_argument("out", help="export folder: rows.jsonl, export.json, prepared/ (prepare-data's output)")
    parser.add_argument("--prepared", help="prepare-data's --output (default: OUT/prepared)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m train (experiment=..., target.path=...)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException

    import train.config  # noqa: F401  (registers each drafter's config schema)

    try:
        check_out(args.stage, Path(args.out))
        with initialize_config_module(config_module="configs", version_base="1.3"):
            cfg = compose(config_name="train", overrides=args.overrides)
        if args.stage == "rows":
            manifest = export_rows(cfg, Path(args.out))
            print(f"{manifest['rows']} rows ({manifest['train_rows']} train, {manifest['eval_rows']} eval) -> {Path(args.out) / ROWS_FILE}")
            print(f"next:\n  {manifest['commands']['prepare_data']}\n  python -m train.data.speculators_export hidden-states "
                  f"{args.out} {' '.join(args.overrides)}\n  {manifest['commands']['train']}")
        else:
            totals = export_hidden_states(cfg, Path(args.out), Path(args.prepared) if args.prepared else None)
            print(f"hidden states: {totals['written']} written, {totals['skipped']} already there, {totals['rows']} rows")
    except (ValueError, HydraException) as e:  # bad input (DataError is one, a bad override a HydraException): one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
