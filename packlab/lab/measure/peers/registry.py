"""Every system notebook 11 measures, by name: the peers, then every packlab format."""

from __future__ import annotations

from packlab.errors import PacklabError
from packlab.formats import format_names
from packlab.lab.measure.peers.arrow_views import ArrowViews
from packlab.lab.measure.peers.base import Peer
from packlab.lab.measure.peers.hf_peer import HfArrow, HfNumpy
from packlab.lab.measure.peers.lance_peer import Lance
from packlab.lab.measure.peers.litdata_peer import LitDataAuto, LitDataPerItem
from packlab.lab.measure.peers.mds_peer import Mds, MdsZstd
from packlab.lab.measure.peers.megatron_peer import Megatron
from packlab.lab.measure.peers.modalities_peer import Modalities
from packlab.lab.measure.peers.packlab_peer import PacklabFormat
from packlab.lab.measure.peers.raw_csr import RawCsr
from packlab.lab.measure.peers.vortex_peer import Vortex

_PEERS: dict[str, type[Peer]] = {cls.NAME: cls for cls in (
    RawCsr, ArrowViews, Megatron, HfArrow, HfNumpy, LitDataPerItem, LitDataAuto, Mds, MdsZstd,
    Lance, Vortex, Modalities)}


def peer_names() -> list[str]:
    """Every system: the peers, then ``packlab_<format>`` for every registered format."""
    return list(_PEERS) + [f"packlab_{name}" for name in format_names()]


def get_peer(name: str) -> Peer:
    if name in _PEERS:
        return _PEERS[name]()
    if name.startswith("packlab_") and name[len("packlab_"):] in format_names():
        return PacklabFormat(name[len("packlab_"):])
    raise PacklabError(f"unknown peer {name!r}; choose from {', '.join(peer_names())}")
