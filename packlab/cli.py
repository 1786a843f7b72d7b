"""The ``packlab`` command.

Each subcommand lives in its own module under ``packlab/commands/`` and defines
``add_parser(subparsers)``, which registers the subcommand and sets ``run`` as its default.

Every failure in use is **one line on stderr, exit code 2**, naming the path (and bin) and the
flag involved, in the command line's words (``--overwrite``, not ``overwrite=True``): a bad
argument (argparse's own errors included: no usage dump), a missing or damaged file, an output
packlab will not replace, invalid data. A broken pipe (``packlab query ... | head -1``) ends the
command quietly with the status a shell gives a process stopped by ``SIGPIPE`` (141): the
reader stopped reading, nothing failed. An interruption (Ctrl-C) prints one line, exit 130. An
unexpected exception is a bug: one line, exit 1 (``PACKLAB_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import pkgutil
import re
import sys
import textwrap
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from packlab import commands
from packlab.commands import emit_json
from packlab.errors import PacklabError, PacklabWarning, one_line
from packlab.version import __version__

SIGPIPE_STATUS = 128 + 13
# Python keyword names some library messages use, and the flags that set them.
_FLAGS = {"overwrite": "--overwrite", "split": "--split", "max_records": "--records",
          "num_sequences": "--num-sequences", "pack_size": "--pack-size",
          "bins_per_shard": "--bins-per-shard", "vocab_size": "--vocab-size",
          "workers": "--workers", "seed": "--seed", "samples": "--samples",
          "batch_size": "--batch-size", "limit": "--limit", "threads": "--threads",
          "memory_limit": "--memory-limit", "token_width": "--token-width"}
_KEYWORD = re.compile(r"\b(?:pass )?(" + "|".join(_FLAGS) + r")=(True\b|\.\.\.|[\w.]+)?")
_USAGE_ERROR: list[str] = []  # the last usage error's line (main prints it as JSON on --json)
_SUBJECT = re.compile(r"^(?:(.*?): )?(" + "|".join(_FLAGS) + r") (must|should)\b")


class HelpFormatter(argparse.HelpFormatter):
    """Help for people: every option that takes a value says its default (added here unless
    its help already says it, or it has none: a flag, or a default of None that its help
    explains), and descriptions are refilled to the terminal paragraph by paragraph, except
    paragraphs laid out by hand (indented lines, tables, lists), which print as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or action.nargs == 0 or default is None
                or default is argparse.SUPPRESS or "default" in text):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else default
        return f"{text} (default: {str(shown).replace('%', '%%')})"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.strip("\n").split("\n\n"):
            lines = paragraph.splitlines()
            if any(line[:1].isspace() or line.startswith("- ") or "  " in line.strip()
                   for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(textwrap.fill(" ".join(paragraph.split()), width,
                                                initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(paragraphs)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump), exit 2; long options only as written
    (``--over`` is not ``--overwrite``: an abbreviation that works today breaks the day a new
    option shares its prefix); help through :class:`HelpFormatter`. Subcommands' parsers are
    made by this class too, so they all behave alike."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """argparse's, with an unknown argument reported by the subcommand it was given to
        (``packlab pack: error: unrecognized arguments: --over``), whose help lists the
        options it has."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            commands = getattr(self, "commands", {})
            commands.get(getattr(parsed, "command", None), self).error(
                f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def unknown_options(self) -> list[str]:
        """The ``--options`` given to this parser that it does not have (a typo's), each
        with the option it is closest to, when one is close (``--formt (did you mean
        --format?)``)."""
        import difflib

        known = [o for action in self._actions for o in action.option_strings]
        out = []
        for token in getattr(self, "_given", []):
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if name.startswith("--") and name not in known:
                close = sorted(o for o in known if o.startswith(name)) or \
                    difflib.get_close_matches(name, known, n=1, cutoff=0.7)
                out.append(f"{token} (did you mean {' or '.join(close)}?)" if close else token)
        return out

    def error(self, message: str) -> NoReturn:
        unknown = self.unknown_options()
        if unknown and (message.startswith("the following arguments are required")
                        or message.startswith("unrecognized arguments")):
            message = f"unrecognized arguments: {' '.join(unknown)}"  # the typo, not its effect
        message = _INVALID_CHOICE.sub(_closest_choice, message)
        line = f"{self.prog}: error: {message} (see `{self.prog} -h`)"
        _USAGE_ERROR.append(line)
        self.exit(2, line + "\n")


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from ([^)]*)\)")


def _closest_choice(match: re.Match[str]) -> str:
    """argparse's "invalid choice" with the choice the typo is closest to, when one is."""
    import difflib

    choices = re.findall(r"'([^']*)'", match.group(2))
    close = difflib.get_close_matches(match.group(1), choices, n=1, cutoff=0.6)
    return match.group(0) + (f"; did you mean '{close[0]}'?" if close else "")


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """The command's parser, built once per process (argparse takes 10-20 ms to build its
    seventy arguments; a parser parses any number of command lines)."""
    parser = Parser(
        prog="packlab", description="Packed SFT data: spools, packing, formats, checks, benchmarks.",
        epilog="Run `packlab COMMAND -h` for what a command does and its options.")
    parser.add_argument("--version", action="version", version=f"packlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"packlab.commands.{info.name}").add_parser(sub)
    parser.commands = sub.choices  # type: ignore[attr-defined]  (see Parser.parse_args)
    return parser


def in_cli_words(message: str) -> str:
    """A library message in the command line's words: ``pass overwrite=True`` becomes
    ``pass --overwrite``, ``token_width=4`` ``--token-width 4``, ``max_records must be
    positive`` ``--records must be positive``."""
    message = _SUBJECT.sub(lambda m: f"{m.group(1) + ': ' if m.group(1) else ''}"
                                     f"{_FLAGS[m.group(2)]} {m.group(3)}", message)
    return _KEYWORD.sub(lambda m: ("pass " if m.group(0).startswith("pass ") else "")
                        + _FLAGS[m.group(1)]
                        + (f" {m.group(2)}" if m.group(2) not in (None, "True", "...") else ""),
                        message)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _USAGE_ERROR.clear()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # -h, --version, or a usage error already printed on one line
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
        if code and _USAGE_ERROR and "--json" in argv:  # the failure as JSON too
            emit_json({"error": _USAGE_ERROR[-1], "exit_code": code})
        return code
    except KeyboardInterrupt:
        print("packlab: interrupted", file=sys.stderr)
        return 130
    where = f"packlab {args.command}"

    def fail(code: int, line: str) -> int:
        """One line on stderr; with ``--json`` (``query --format json``), the same failure as
        one JSON object on stdout, with what the command adds to it (``failure``)."""
        print(f"{where}: {line}", file=sys.stderr)
        if getattr(args, "json", False) or getattr(args, "output", None) == "json":
            extra = getattr(args, "failure", None)
            emit_json({**(extra(args) if extra else {}), "error": f"{where}: {line}",
                       "exit_code": code})
        return code

    try:
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always", PacklabWarning)
            code = int(args.run(args) or 0)
        said = set()
        for warning in heard:  # after success: a failure stays one line
            text = str(warning.message)
            if issubclass(warning.category, PacklabWarning) and text not in said:
                said.add(text)
                print(f"{where}: warning: {in_cli_words(one_line(text))}", file=sys.stderr)
            elif not issubclass(warning.category, PacklabWarning):
                warnings.showwarning(warning.message, warning.category, warning.filename,
                                     warning.lineno)
        return code
    except BrokenPipeError:
        _silence_stdout()
        return SIGPIPE_STATUS
    except PacklabError as exc:
        return fail(2, f"error: {in_cli_words(one_line(exc))}")
    except OSError as exc:
        return fail(2, f"error: {_named(exc.filename)}: {exc.strerror or one_line(exc)}")
    except KeyboardInterrupt:
        return fail(130, "interrupted (run the same command again to finish what it was "
                         "writing)" if getattr(args, "resumable", False) else "interrupted")
    except Exception as exc:
        if os.environ.get("PACKLAB_DEBUG"):
            raise
        return fail(1, f"internal error: {type(exc).__name__}: {one_line(exc)[:300]} (a bug: "
                       "please report it; PACKLAB_DEBUG=1 shows the traceback)")


def _named(filename: Any) -> str:
    """The file an OS error names, as the user named it: a hidden temporary is the path it was
    written for, a one-file output's record the output itself."""
    if filename is None:
        return "(no file)"
    from pathlib import Path

    from packlab.sources.file_records import recorded_file
    from packlab.storage.files import stands_for

    return str(recorded_file(stands_for(Path(os.fsdecode(filename)))))


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush does
    not fail (and print a traceback) on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
