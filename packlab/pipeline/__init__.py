"""Spool + assignment -> shards on disk: the writing side of packlab.

- :mod:`~packlab.pipeline.shards`: shard names and ranges, one shard job, many in parallel,
  reruns that keep what a receipt still vouches for;
- :mod:`~packlab.pipeline.receipts`: the receipt beside each shard;
- :mod:`~packlab.pipeline.dataset_record`: the dataset record, written first and finished last.

Shard jobs run through :mod:`packlab.executors` (a process pool, or Ray).
"""
