"""Peers: the same bins in other systems, read back through one interface, timed side by side.

Notebook 11's back end. One module per system (an adapter: :class:`~.base.Peer`), each writing
the reference bins with that system's own writer and reading them with its own reader:

- :mod:`~.raw_csr`: raw CSR numpy memmap (all three columns; the floor of the bytes);
- :mod:`~.arrow_views`: Arrow IPC through numpy views;
- :mod:`~.megatron_peer`: Megatron-core ``IndexedDataset`` (tokens only);
- :mod:`~.hf_peer`: Hugging Face ``datasets``, arrow and numpy formats;
- :mod:`~.litdata_peer`: LitData ``StreamingDataset`` (``batch_decode`` 0 and auto);
- :mod:`~.mds_peer`: MosaicML streaming, uncompressed and zstd, in its own environment
  (:mod:`~.mds_env`);
- :mod:`~.lance_peer`: Lance ``take``; :mod:`~.vortex_peer`: Vortex, a scan of one index;
- :mod:`~.modalities_peer`: Modalities ``PackedMemMapDatasetBase`` (tokens only);
- :mod:`~.packlab_peer`: every registered packlab format through ``open_dataset``.

:mod:`~.run` holds the rules (verify, warm, interleaved delivered reads, floors in the same
loop, bytes on disk); :mod:`~.registry` names every system; :func:`side_by_side` runs them
all; :mod:`~.summary` turns the rows into
the table and the findings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError
from packlab.lab.measure.peers.base import Reference
from packlab.lab.measure.peers.mds_env import run_elsewhere
from packlab.lab.measure.peers.packlab_peer import PacklabFormat
from packlab.lab.measure.peers.raw_csr import RawCsr
from packlab.lab.measure.peers.registry import get_peer, peer_names
from packlab.lab.measure.peers.run import compare
from packlab.lab.measure.timing import seeded_indices
from packlab.progress import settle_tqdm_auto

settle_tqdm_auto()  # the peers import HF datasets and LitData, which import tqdm.auto

__all__ = ["get_peer", "peer_names", "side_by_side"]
FLOOR_FORMAT = "memmap_v1"


def side_by_side(
    reference: Reference,
    out_dir: str | os.PathLike[str],
    *,
    names: Sequence[str] | None = None,
    samples: int = 2000,
    seed: int = 0,
    max_seconds: float | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Every system in ``names`` (default: all) on the same bins, under the same rules
    (:mod:`packlab.lab.measure.peers.run`); peers of another environment in a subprocess of it
    with raw CSR and the floors beside them. ``max_seconds``: each system's budget for each of
    verification, warm pass and timed reads (:func:`packlab.lab.measure.peers.run.compare`). Returns ``rows`` (one per system and floor,
    ``environment`` saying where it ran), ``skipped`` (with reasons), ``samples``, ``seed``,
    ``num_bins``, ``num_tokens``."""
    root = Path(out_dir)
    peers = [get_peer(n) for n in (names if names is not None else peer_names())]
    indices = seeded_indices(len(reference), samples, seed)
    reference_dir = root / "reference_csr"
    RawCsr().write(reference, reference_dir)
    floor_dir = root / "floor"
    floor = PacklabFormat(FLOOR_FORMAT)
    floor.write(reference, floor_dir)
    here = [p for p in peers if not p.ENVIRONMENT]
    result = compare(reference, root / "venv", here, floor_shard=floor.shard(floor_dir),
                     indices=indices, max_seconds=max_seconds, seed=seed, log=log)
    for environment in dict.fromkeys(p.ENVIRONMENT for p in peers if p.ENVIRONMENT):
        names_there = [p.NAME for p in peers if p.ENVIRONMENT == environment]
        there = run_elsewhere(environment, [*names_there, RawCsr.NAME],
                              reference_dir=reference_dir, floor_shard=floor.shard(floor_dir),
                              out_dir=root / environment, indices=indices,
                              max_seconds=max_seconds)
        for skip in there["skipped"]:
            log(f"[peers] skipped {skip['system']}: {skip['reason']}")
        for row in there["rows"]:  # raw CSR ran there as a floor of that process
            if row["name"] not in names_there:
                row["kind"] = "floor"
        result["rows"] += there["rows"]
        result["skipped"] += [s for s in there["skipped"] if s["name"] != RawCsr.NAME]
        result.setdefault("environments", {})[environment] = {
            **there.get("versions", {}), "peak_rss_growth_bytes": there.get("peak_rss_growth_bytes")}
    packlab_names = {p.NAME for p in peers if p.KIND == PacklabFormat.KIND}
    ours = [s for s in result["skipped"] if s["name"] in packlab_names]
    if ours:  # another library may be missing here; packlab's own formats must run
        raise PacklabError(f"{ours[0]['system']} could not be measured: "
                           f"{ours[0]['reason']}")
    result.update(seed=seed, num_bins=len(reference), num_tokens=reference.num_tokens,
                  pack_size=reference.pack_size)
    return result
