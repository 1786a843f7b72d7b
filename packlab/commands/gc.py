"""Remove the temporaries that killed writers left under OUT, and nothing else.

Every writer works under a hidden temporary name beside its final one, .NAME.tmp-PID-XXXXXXXX
(scratch files add a suffix to it), and publishes with one rename, so a writer killed mid-way
leaves a temporary behind, never a half shard. gc removes a temporary when both hold:

- the process whose id is in its name is not running on this machine (gone, or a zombie);
- no packlab job is writing in its directory (gc takes the directory's lock for the sweep,
  and leaves a directory a running job holds alone).

Nothing else is ever touched: finished shards, receipts, records, links (never followed),
and temporaries whose name carries no process id. Writers on other machines sharing the
filesystem are not seen: run gc where the writers ran.

Prints one line (--json: one object with every path removed or kept, and why).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from packlab.commands import emit_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser("gc", help="remove temporaries left by killed writers",
                       description=__doc__)
    p.add_argument("out", metavar="OUT",
                   help="an output directory (or any directory writers wrote into)")
    p.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.errors import PacklabError
    from packlab.storage.location import is_remote

    if is_remote(args.out):  # temporaries belong to writers on this machine
        raise PacklabError(f"{args.out}: gc sweeps a local directory (the temporaries of "
                           "writers that ran on this machine), not a URI")
    result = sweep(Path(args.out), dry_run=args.dry_run)
    if args.json:
        emit_json(result)
        return 0
    verb = "would remove" if args.dry_run else "removed"
    kept = f"; kept {len(result['kept'])} in use" if result["kept"] else ""
    print(f"gc {args.out}: {verb} {len(result['removed'])} temporaries "
          f"({result['bytes']:,} bytes){kept}")
    return 0


def temporaries(root: Path) -> Iterator[Path]:
    """Temporary entries under ``root``, not following links, not looking inside one."""
    from packlab.storage.files import is_temporary

    for directory, subdirs, files in os.walk(root):  # links are listed, never followed
        here = Path(directory)
        for name in sorted(subdirs):
            if is_temporary(here / name):
                subdirs.remove(name)  # swept whole, not looked into
                yield here / name
        for name in sorted(files):
            if is_temporary(here / name):
                yield here / name


def sweep(root: Path, *, dry_run: bool = False) -> dict[str, Any]:
    """Remove (or with ``dry_run`` list) the temporaries under ``root`` no live writer owns."""
    from packlab.errors import PacklabError
    from packlab.pipeline.dataset_record import writing_lock
    from packlab.storage.files import process_running, remove, temporary_owner

    if not root.is_dir():
        raise PacklabError(f"{root}: not a directory" if root.exists() or root.is_symlink()
                           else f"{root}: no such directory")
    found: dict[Path, list[Path]] = {}
    for path in temporaries(root):
        found.setdefault(path.parent, []).append(path)
    removed: list[str] = []
    kept: list[dict[str, str]] = []
    size = 0
    for directory, paths in sorted(found.items()):
        with ExitStack() as held:
            try:
                held.enter_context(writing_lock(directory))
            except PacklabError:
                kept.extend({"path": str(p), "reason": "a packlab job is writing here"}
                            for p in paths)
                continue
            for path in paths:
                owner = temporary_owner(path)
                if owner is None or process_running(owner):
                    why = "no writer id in its name" if owner is None else \
                        f"its writer (pid {owner}) is running"
                    kept.append({"path": str(path), "reason": why})
                    continue
                size += _size(path)
                removed.append(str(path))
                if not dry_run:
                    remove(path)
    return {"out": str(root), "dry_run": dry_run, "removed": removed, "bytes": size,
            "kept": kept}



def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())

