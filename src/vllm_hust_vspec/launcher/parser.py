"""The launcher's argparse parser, generated from the option schema.

Every flag's default is ``argparse.SUPPRESS`` so that only flags the user typed appear in
the parsed namespace: that is what lets the command line win over TOML and protocol while
everything unset keeps the schema default.  Values are converted and range-checked by
:func:`vllm_hust_vspec.settings.parse_value`, so CLI, TOML and env share one set of rules.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from vllm_hust_vspec import settings
from vllm_hust_vspec import retired
from vllm_hust_vspec.launcher.errors import LaunchError

PROG = "vllm-hust-vspec"

# Help sections, in the order --help shows them.
_GROUP_TITLES = {
    "launcher": "launcher",
    "speculation": "speculation",
    "acceptance": "lossy acceptance (opt-in: output differs from the target's; plugin)",
    "server": "vLLM server arguments (passed only when set)",
    "graphs": "graph capture",
    "controller": "adaptive controller (plugin; travels as HUST_VSPEC_*)",
    "observability": "decision trace and logs (plugin)",
}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``PROG: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        # one line, whatever the arguments hold (a line break in one is shown escaped)
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def cli_options() -> list[settings.Option]:
    return [o for o in settings.OPTIONS if o.cli]


def _help(opt: settings.Option) -> str:
    text = opt.help
    if opt.choices and opt.name != "method":
        text += f" Choices: {', '.join(opt.choices)}."
    if opt.type == "bool" and opt.negatable and opt.default is not None:
        text += f" Default: {'on' if opt.default else 'off'}."
    elif opt.type != "bool" and opt.default not in (None, ()):
        text += f" Default: {settings.format_env_value(opt, opt.default)}."
    return text.replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Start vLLM with adaptive speculative decoding (vllm-hust-vspec). "
        "Precedence: schema default < --protocol < --config TOML [serve] < flags. Native "
        "vLLM arguments go after --.",
        allow_abbrev=False,
    )
    groups: dict[str, Any] = {
        name: parser.add_argument_group(title) for name, title in _GROUP_TITLES.items()
    }
    for opt in cli_options():
        group = groups.get(opt.group)
        if group is None:
            group = parser.add_argument_group(_GROUP_TITLES.get(opt.group, opt.group))
            groups[opt.group] = group
        flag = opt.cli_flag
        if opt.type == "bool":
            if opt.negatable:
                group.add_argument(flag, dest=opt.name, action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=_help(opt))
            else:
                group.add_argument(flag, dest=opt.name, action="store_true",
                                   default=argparse.SUPPRESS, help=_help(opt))
            continue
        metavar = {"int": "N", "float": "X", "path": "PATH", "int_list": "N,N",
                   "str_list": "A,B"}.get(opt.type, "VALUE")
        if opt.name == "method":
            metavar = "METHOD"
        elif opt.choices:
            metavar = "{" + "|".join(opt.choices) + "}"
        group.add_argument(flag, dest=opt.name, default=argparse.SUPPRESS, metavar=metavar,
                           help=_help(opt))
    return parser


def split_extra_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: ours before, native vLLM arguments after."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_cli(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``(explicit options, extra vLLM args)``.  Only flags given on the command line are
    in the dict, converted and validated; a bad value raises :class:`LaunchError`."""
    ours, extra = split_extra_args(argv)
    for arg in ours:
        flag = arg.split("=", 1)[0]
        if flag in retired.BY_FLAG:
            raise LaunchError(retired.message(retired.BY_FLAG[flag], flag))
    ns = build_parser().parse_args(ours)
    explicit: dict[str, Any] = {}
    for name, raw in vars(ns).items():
        opt = settings.option(name)
        if opt.type == "bool":
            explicit[name] = bool(raw)
            continue
        try:
            explicit[name] = settings.parse_value(opt, raw, opt.cli_flag)
        except settings.SettingsError as exc:
            raise LaunchError(str(exc)) from None
    return explicit, extra
