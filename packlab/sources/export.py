"""``export``: a spool (local or on object storage) written as a Megatron-core ``.bin/.idx``
prefix, local or on object storage, through :func:`packlab.sources.outputs.output` as every
writing command writes (a URI is staged, then uploaded; ``--overwrite`` replaces only a prefix
packlab exported). The work is :func:`packlab.spool_export.export_spool`.

The output is named by its prefix (``OUT`` for ``OUT.bin``/``OUT.idx``); its ``.idx`` is what
``output`` guards and publishes, last: on object storage the ``.bin``, the mask sidecar and the
record are uploaded first, then the ``.idx`` (the file megatron-core opens first).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packlab.chat_masks import MarkerTokens
from packlab.errors import FormatError
from packlab.sources.outputs import output, spool_at
from packlab.spool import SpoolReader
from packlab.spool_export import export_spool
from packlab.spool_prefix import PREFIX_VERSION, prefix_files
from packlab.storage import is_remote, resolve, upload_file


def export(src: str | os.PathLike[str], out: str, *, markers: MarkerTokens | None = None,
           overwrite: bool = False) -> dict[str, Any]:
    """Export the spool (or Megatron prefix) at ``src`` as the prefix ``out``; its record,
    with ``path``. ``markers``: masks derived from the chat role markers (the only masks a
    prefix Megatron wrote has)."""
    reader = open_spool(str(src), markers)
    idx = f"{out}.idx"
    with output(idx, kind="file", overwrite=overwrite, recognise=is_exported_index,
                what="a prefix packlab exported (its .spool.json beside it)") as local:
        prefix = Path(str(local)[:-len(".idx")])
        record = export_spool(reader, prefix, markers=markers, overwrite=True)
        if is_remote(idx):
            target = resolve(idx).parent
            for key in ("bin", "masks", "record"):  # the .idx goes last, by output()
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


def is_exported_index(path: Path) -> bool:
    """An ``.idx`` whose prefix has packlab's export record: what ``--overwrite`` may replace."""
    record = prefix_files(path.with_suffix(""))["record"]
    return path.suffix == ".idx" and record.is_file() and PREFIX_VERSION in record.read_text()
