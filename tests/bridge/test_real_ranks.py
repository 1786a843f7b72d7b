"""Seed 003's design on real ranks (torch.distributed, gloo, 127.0.0.1; two DataLoader workers
a rank), its indices given by Megatron-Bridge's own ``MegatronPretrainingSampler``: each rank
asks for what Bridge's sampler gives it, and is served what packlab's model of the design
predicts (:func:`packlab.lab.per_rank.coverage.seed_epoch`, over packlab's reproduction of the
sampler, which ``test_megatron_samplers.py`` shows equal to Bridge's): samples served twice and
samples never served, on real processes. The rank-local fix on real ranks:
``tests/test_distributed.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from bridge_ranks import run_phases_with_bridge
from conftest import write_random_spool

from packlab.lab.per_rank.coverage import coverage, seed_epoch
from packlab.lab.per_rank.launch import launch
from packlab.loading.per_rank import ChunkPlan, ChunkProducer, spool_source
from packlab.packing import pack

pytestmark = pytest.mark.slow  # real ranks: `make test-fast` leaves it out

PACK = 512
MBS = 2
DEADLINE = 150.0  # seconds; far above a normal run, so only a hang reaches it
BRIDGES = "megatron.bridge.data.samplers.MegatronPretrainingSampler"


@pytest.fixture
def findable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bridge_ranks`` findable by the ranks' forkserver, a fresh interpreter that imports it
    once for all ranks: it reads ``PYTHONPATH``, not pytest's ``sys.path`` (Python 3.12.1's
    forkserver drops the ``sys.path`` multiprocessing hands it). Without it every rank imports
    Bridge itself."""
    here = Path(__file__).resolve().parent
    paths = [str(here), str(here.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.mark.parametrize("world_size", [2, 4])
def test_seed_design_on_real_ranks_under_bridges_sampler(world_size: int, tmp_path,
                                                         findable: None) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=130, max_len=250, seed=3)
    assignment, _ = pack(spool.lengths, PACK, algorithm="next_fit")
    # chunks of two global batches: where the design loses (W-1)/W of the samples
    plan = ChunkPlan(num_samples=assignment.num_bins, samples_per_chunk=2 * MBS * world_size,
                     format="jsonl", pack_size=PACK)
    ChunkProducer(tmp_path / "chunks", plan).produce(spool_source(spool, assignment))
    phase = {"directory": str(tmp_path / "chunks"), "micro_batch_size": MBS, "num_workers": 2,
             "timeout": 60.0, "design": "seed"}
    results = launch(run_phases_with_bridge, world_size, {"phases": [phase]}, tmp_path / "run",
                     timeout=DEADLINE, preload=["bridge_ranks"])
    ranks = [r["phases"][0] for r in results]
    assert [p["rank"] for p in ranks] == list(range(world_size))
    for p in ranks:
        assert "error" not in p, p["error"]
        assert p["sampler"] == BRIDGES
    asked, predicted = seed_epoch(plan, world_size, MBS)
    for rank, p in enumerate(ranks):
        assert p["asked"] == asked[rank].tolist()
        assert p["sample_ids"] == predicted[rank].tolist()
    real = coverage([np.array(p["sample_ids"]) for p in ranks], plan.num_samples)
    assert real.extra > 0 and real.lost > plan.num_samples // 4
