"""The ``packlab`` command.

Each subcommand lives in its own module under ``packlab/commands/`` and defines
``add_parser(subparsers)``, which registers the subcommand and sets ``run`` as its default.
Errors in use (missing file, bad argument, invalid data) print one line naming the problem and
exit with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from packlab import commands
from packlab.errors import PacklabError
from packlab.version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="packlab", description="Packed SFT data: spools, packing, formats, checks, benchmarks."
    )
    parser.add_argument("--version", action="version", version=f"packlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"packlab.commands.{info.name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except PacklabError as exc:
        print(f"packlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        print(f"packlab {args.command}: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"packlab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
