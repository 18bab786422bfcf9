"""Which named tensors two sets of them disagree on, by name and shape: a drafter's file or checkpoint against the
model a config builds (``infer.loading.check_drafter_weights``, ``train.checkpoint.state_mismatch``,
``train.export.check_weights``)."""

from __future__ import annotations

Shape = tuple[int, ...]


def shape_differences(found: dict[str, Shape], expected: dict[str, Shape]) -> list[tuple[str, Shape | None, Shape | None]]:
    """(name, its shape in ``found`` or None, its shape in ``expected`` or None) for every name missing from one side or
    shaped differently, sorted by name; empty when they agree."""
    return [(name, found.get(name), expected.get(name)) for name in sorted(set(found) | set(expected))
            if found.get(name) != expected.get(name)]
