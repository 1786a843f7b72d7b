"""What several formats share: the format contract and the pieces more than one format uses.

- :mod:`~packlab.formats.shared.base`: the writer protocol, the reader base, the shard record;
- :mod:`~packlab.formats.shared.stacks`: what the training stacks read;
- :mod:`~packlab.formats.shared.arrow_lists`: bins as Arrow list columns (Parquet, Arrow IPC);
- :mod:`~packlab.formats.shared.fingerprints`: fingerprints of files with no room for an
  identity (a Megatron pair);
- :mod:`~packlab.formats.shared.npy_identity`: a shard's identity in its ``.npy`` headers;
- :mod:`~packlab.formats.shared.scratch`: an append-only on-disk array a writer reads back.
"""
