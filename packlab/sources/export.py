"""``export``: a spool written as a Megatron-core ``.bin/.idx`` prefix, each local or on object
storage. It is written through :func:`packlab.sources.outputs.output` as every
writing command writes (a URI is staged, then uploaded; ``--overwrite`` replaces only a prefix
packlab exported). The work is :func:`packlab.spool.export.export_spool`.

The output is named by its prefix (``OUT`` for ``OUT.bin``/``OUT.idx``); its ``.idx`` is what
``output`` guards and publishes, last: on object storage the record, the ``.bin`` and the mask
sidecar are uploaded first, then the ``.idx`` (the file megatron-core opens first).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packlab.errors import FormatError, PacklabError
from packlab.sources.outputs import REFUSAL, output, spool_at
from packlab.spool import SpoolReader
from packlab.spool.export import export_spool
from packlab.spool.masks import MarkerTokens
from packlab.spool.prefix import PREFIX_VERSION, SUFFIXES, prefix_files
from packlab.storage.files import parse_json
from packlab.storage.location import Location, is_remote, resolve
from packlab.storage.objects import upload_file


def export(src: str | os.PathLike[str], out: str, *, markers: MarkerTokens | None = None,
           overwrite: bool = False) -> dict[str, Any]:
    """Export the spool (or Megatron prefix) at ``src`` as the prefix ``out`` (named by
    itself, its ``.idx`` or its ``.bin``); its record, with ``path``. ``markers``: masks
    derived from the chat role markers (the only masks a prefix Megatron wrote has)."""
    if out.endswith((".bin", ".idx")) and not out.endswith(SUFFIXES["masks"]):
        out = out[:-len(".idx")]  # OUT.idx or OUT.bin names the prefix OUT, as on the way in
    check_companions(out)
    reader = open_spool(str(src), markers)
    idx = f"{out}.idx"
    with output(idx, kind="file", overwrite=overwrite, recognise=is_exported_index,
                what="a prefix packlab exported (its .spool.json beside it)") as local:
        prefix = Path(str(local)[:-len(".idx")])
        record = export_spool(reader, prefix, markers=markers, overwrite=True)
        if is_remote(idx):
            target = resolve(idx).parent
            for key in ("record", "bin", "masks"):  # the .idx goes last, by output()
                file = prefix_files(prefix)[key]
                upload_file(file, target / file.name, overwrite=True)
    return {**record, "path": out}


def open_spool(src: str, markers: MarkerTokens | None = None) -> SpoolReader:
    """A reader of the spool folder or Megatron prefix ``src`` (local, or a URI: fetched once
    into the verified cache), its masks derived from ``markers`` when given."""
    reader = spool_at(src)
    if reader is None:
        raise FormatError(f"{src}: neither a spool (spool_v1) nor a Megatron .bin/.idx prefix")
    return reader if markers is None else SpoolReader(reader.path, markers=markers)


def check_companions(out: str) -> None:
    """Refuse a prefix whose files, other than its ``.idx`` (which :func:`output` guards),
    are not a prefix packlab exported: a person's ``OUT.bin`` or ``OUT.spool.json`` is never
    replaced, ``--overwrite`` or not; nor is a folder named ``OUT`` taken for a prefix (its
    files would go beside it, not in it). An export publishes its record first: files beside
    it are the export's own, whole or as a killed export left them (the same command
    finishes it)."""
    prefix = resolve(out)
    if prefix.is_dir():
        raise PacklabError(f"{out}: a folder; export writes the prefix's files beside a path, "
                           f"not in it ({prefix.name}.bin, {prefix.name}.idx, ...): name one "
                           f"inside it ({out.rstrip('/')}/NAME) or another path")
    files = {key: resolve(f"{out}{suffix}") for key, suffix in SUFFIXES.items()}
    if _exported_record(files["record"], prefix.name):
        return  # packlab's prefix, whole or as a killed export left it (its record first)
    for key in ("record", "bin", "masks"):
        if files[key].exists():
            raise PacklabError(f"{files[key]}: exists, and exporting the prefix {prefix.name} "
                               f"would replace it; {REFUSAL}")


def _exported_record(record: Location, name: str) -> bool:
    """Whether ``record`` is the record packlab's export of the prefix ``name`` publishes
    before any other file of it."""
    try:
        written = parse_json(record.read_bytes(), record) if record.is_file() else None
    except (FormatError, OSError):
        return False
    return isinstance(written, dict) and written.get("version") == PREFIX_VERSION and \
        written.get("prefix") == name


def is_exported_index(path: Path) -> bool:
    """An ``.idx`` whose prefix has packlab's export record: what ``--overwrite`` may replace."""
    record = prefix_files(path.with_suffix(""))["record"]
    return path.suffix == ".idx" and record.is_file() and PREFIX_VERSION in record.read_text()
