"""The output layout a training config points at: ``splits/``, ``runs/``, ``blend.json``.

- :mod:`~packlab.pipeline.layout.splits`: train/valid/test decided per sequence, by content, seeded;
- :mod:`~packlab.pipeline.layout.hashes`: deterministic run and configuration hashes;
- :mod:`~packlab.pipeline.layout.build`: spools -> resumable shards -> relative links -> ``blend.json``;
- :mod:`~packlab.pipeline.layout.blend`: reading it back (a split from ``splits/`` or ``blend.json``),
  ``nano3_packed_sft_dir`` paths, sampling by the blend's weights.

``packlab pack SPOOL [SPOOL ...] OUT --format parquet --pack-size 4096
--split train=0.98,valid=0.01,test=0.01 [--weights 0.7,0.3]`` writes it;
``packlab.open_dataset(OUT, split="train")`` reads a split.
"""

from __future__ import annotations

from packlab.pipeline.layout.blend import (
    BLEND_FILE,
    is_layout,
    known_splits,
    layout_shards,
    nano3_paths,
    read_blend,
    split_source,
    weighted_indices,
)
from packlab.pipeline.layout.build import build_layout, copy_layout, dataset_names
from packlab.pipeline.layout.splits import (
    parse_fractions,
    parse_weights,
    sequence_keys,
    split_sequences,
)

__all__ = [
    "BLEND_FILE", "build_layout", "copy_layout", "dataset_names", "is_layout", "known_splits", "layout_shards",
    "nano3_paths", "parse_fractions", "parse_weights", "read_blend", "sequence_keys",
    "split_sequences", "split_source", "weighted_indices",
]
