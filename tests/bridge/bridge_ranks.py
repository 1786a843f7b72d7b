"""Real ranks driven by Megatron-Bridge's own sampler (test support).

Importing this module imports Bridge's samplers (behind :mod:`bridge_code`'s one stand-in):
the real-rank tests name it for the ranks' forkserver to import once before forking
(:func:`packlab.lab.per_rank.launch.launch`'s ``preload``), and :func:`run_phases_with_bridge`
is the job those ranks run.
"""

from __future__ import annotations

from typing import Any

from bridge_code import import_bridge

from packlab.lab.per_rank.launch import run_phases

SAMPLERS = import_bridge(("samplers",)).samplers


def run_phases_with_bridge(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """:func:`~packlab.lab.per_rank.launch.run_phases`, seed 003's design given its indices by
    Bridge's ``MegatronPretrainingSampler`` instead of packlab's reproduction."""
    phases = [{**phase, "sampler": SAMPLERS.MegatronPretrainingSampler}
              if phase.get("design") == "seed" else phase for phase in config["phases"]]
    return run_phases(rank, world_size, {**config, "phases": phases})
