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
import warnings
from collections.abc import Sequence
from typing import NoReturn

from packlab import commands
from packlab.errors import PacklabError, PacklabWarning, one_line
from packlab.version import __version__

SIGPIPE_STATUS = 128 + 13
# Python keyword names some library messages use, and the flags that set them.
_FLAGS = {"overwrite": "--overwrite", "split": "--split", "max_records": "--records",
          "num_sequences": "--num-sequences", "pack_size": "--pack-size",
          "bins_per_shard": "--bins-per-shard", "vocab_size": "--vocab-size",
          "workers": "--workers", "seed": "--seed", "samples": "--samples",
          "batch_size": "--batch-size", "limit": "--limit", "threads": "--threads",
          "memory_limit": "--memory-limit"}
_KEYWORD = re.compile(r"\b(?:pass )?(" + "|".join(_FLAGS) + r")=(?:True|\.\.\.)?")
_SUBJECT = re.compile(r"^(?:(.*?): )?(" + "|".join(_FLAGS) + r") (must|should)\b")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} -h`)\n")


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """The command's parser, built once per process (argparse takes 10-20 ms to build its
    seventy arguments; a parser parses any number of command lines)."""
    parser = Parser(
        prog="packlab", description="Packed SFT data: spools, packing, formats, checks, benchmarks."
    )
    parser.add_argument("--version", action="version", version=f"packlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"packlab.commands.{info.name}").add_parser(sub)
    return parser


def in_cli_words(message: str) -> str:
    """A library message in the command line's words: ``pass overwrite=True`` becomes
    ``pass --overwrite``, ``max_records must be positive`` ``--records must be positive``."""
    message = _SUBJECT.sub(lambda m: f"{m.group(1) + ': ' if m.group(1) else ''}"
                                     f"{_FLAGS[m.group(2)]} {m.group(3)}", message)
    return _KEYWORD.sub(lambda m: ("pass " if m.group(0).startswith("pass ") else "")
                        + _FLAGS[m.group(1)], message)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # -h, --version, or a usage error already printed on one line
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except KeyboardInterrupt:
        print("packlab: interrupted", file=sys.stderr)
        return 130
    where = f"packlab {args.command}"
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
        print(f"{where}: error: {in_cli_words(one_line(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        name = exc.filename if exc.filename is not None else "(no file)"
        print(f"{where}: error: {name}: {exc.strerror or one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{where}: interrupted (run the same command again to finish what it was "
              "writing)" if getattr(args, "resumable", False) else f"{where}: interrupted",
              file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("PACKLAB_DEBUG"):
            raise
        print(f"{where}: internal error: {type(exc).__name__}: {one_line(exc)[:300]} (a bug: "
              "please report it; PACKLAB_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


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
