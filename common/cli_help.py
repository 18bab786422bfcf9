"""The CLIs' help formatter: argparse's defaults in the help, where they say something."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: X)`` added where the help does not already name a default, the default is not None, and the option
    takes a value: a flag's default (``--no-prefix-reuse``'s True) read as the flag being on."""

    # _get_help_string is the one hook argparse's own ArgumentDefaultsHelpFormatter overrides (its docs name only the class
    # as public): tests/test_cli_help.py renders both CLIs' help, so a change there fails a test, not the help silently
    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.nargs == 0 or "default" in text:
            return action.help
        return super()._get_help_string(action)
