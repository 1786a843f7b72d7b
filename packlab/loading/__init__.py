"""Reading shards for training: shards as one dataset, samplers, collate, per-rank loading.

- :mod:`~packlab.loading.discovery`: the shards a path names, local or on object storage;
- :mod:`~packlab.loading.dataset`: shards read as one map-style dataset;
- :mod:`~packlab.loading.samplers`: the order bins are read in;
- :mod:`~packlab.loading.collate`: bins to batches;
- :mod:`~packlab.loading.per_rank`: each data-parallel rank reading only its own chunk files.
"""
