"""The CLIs' help formatter (argparse's defaults in the help, where they say something), and their errors named by the flag."""

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


def named_by_flag(e: ValueError, names: tuple[tuple[str, str], ...]) -> ValueError:
    """``e`` with the parameter name at its start (``names``' first of a pair, e.g. ``top_p=``) written as the flag the
    user of a CLI typed (the pair's second, ``--top-p ``): the checks below the CLIs name their parameters."""
    message = str(e)
    for name, flag in names:
        if message.startswith(name):
            return ValueError(flag + message[len(name):])
    return e
