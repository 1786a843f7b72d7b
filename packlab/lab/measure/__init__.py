"""Honest measurement: peak memory, latency, throughput and size (docs/design.md, "How we
measure").

One concept per module, one implementation per measurement (``packlab bench`` and the
notebooks call the same functions):

- :mod:`~packlab.lab.measure.memory`: this process's RSS (``/proc/self/status``), sampled, per phase;
- :mod:`~packlab.lab.measure.harness`: a job in a fresh process; tracemalloc in a separate run;
- :mod:`~packlab.lab.measure.jobs`: the importable jobs the harness runs;
- :mod:`~packlab.lab.measure.footprint`: load/read and write memory of a shard, flattened;
- :mod:`~packlab.lab.measure.sweep`: peak memory per format as the dataset grows (notebook 04);
- :mod:`~packlab.lab.measure.claims`: the RFC's memory table against what was measured;
- :mod:`~packlab.lab.measure.pagecache`: ``mincore`` residency, cache eviction and filling;
- :mod:`~packlab.lab.measure.delivery`: every timed read delivered inside its timer; percentiles;
- :mod:`~packlab.lab.measure.reading`: what a benchmark reads through (dataset or reader), warmed
  or made to forget;
- :mod:`~packlab.lab.measure.timing`: the one timing loop of random access (seeded indices, each
  read timed alone and delivered, floors in the same loop, interleaved, budgets);
- :mod:`~packlab.lab.measure.floors`: every floor (raw CSR numpy over the same files, the Python
  floor: bins in RAM, memcpy and raw pread of the same bytes), the cold floors of a memory map;
- :mod:`~packlab.lab.measure.latency`: random-access latency, warm and cold, floors beside it;
  batched against single reads (notebook 05, ``packlab bench latency``);
- :mod:`~packlab.lab.measure.integrity`: what integrity on read costs a warm read;
- :mod:`~packlab.lab.measure.throughput`: sequential scan and DataLoader rates;
- :mod:`~packlab.lab.measure.rowgroups`: Parquet row groups: shuffled epochs, misses, the RFC's
  row-group table measured;
- :mod:`~packlab.lab.measure.access_report`: notebook 05's targets, tables and headline numbers;
- :mod:`~packlab.lab.measure.size`: bytes on disk against raw data and token entropy, per format
  and against padding;
- :mod:`~packlab.lab.measure.compression`: Parquet encodings (codec, level, column encodings)
  swept for size and speed;
- :mod:`~packlab.lab.measure.verdicts`: the verdict words (tables and units: :mod:`packlab.lab.tables`);
- :mod:`~packlab.lab.measure.workload`: a synthetic spool and packing for the benchmarks;
- :mod:`~packlab.lab.measure.packing_sweep`: every packer as N grows and per length profile
  (notebook 02); :mod:`~packlab.lab.measure.trl_packing`: TRL's BFD on the same lengths;
- :mod:`~packlab.lab.measure.prefix_export`: a spool exported as a Megatron prefix and read back,
  tokens per second of each step (the export figures);
- :mod:`~packlab.lab.measure.peers`: the same bins in other systems (Megatron-core, HF datasets,
  LitData, MDS, Lance, Vortex, Modalities, raw CSR, Arrow views) beside packlab's formats (notebook 11);
- :mod:`~packlab.lab.measure.queries`, :mod:`~packlab.lab.measure.per_rank`,
  :mod:`~packlab.lab.measure.object_store`: the back ends of notebooks 07, 08 and 09.
"""

from __future__ import annotations

from packlab.lab.measure.footprint import load_memory, write_memory
from packlab.lab.measure.harness import profile, run_job
from packlab.lab.measure.latency import latency
from packlab.lab.measure.pagecache import drop_cache, drop_shard, resident_pages
from packlab.lab.measure.size import size_report
from packlab.lab.measure.throughput import dataloader, scan

__all__ = [
    "dataloader", "drop_cache", "drop_shard", "latency", "load_memory", "profile",
    "resident_pages", "run_job", "scan", "size_report", "write_memory",
]
