"""The read path shared by every format whose bins are runs of values in its files.

- :mod:`~packlab.formats.read.table`: three columns and a bin index, each bin read by ``pread``
  into arrays of its own;
- :mod:`~packlab.formats.read.item_table`: a format that stores one item per bin;
- :mod:`~packlab.formats.read.shard_reads`: a shard's reads, local or ranged, of the kind
  chosen once for where the shard is (:func:`~packlab.formats.read.shard_reads.reads_for`);
- :mod:`~packlab.formats.read.ranged`: the same columns on object storage, by ranged GETs.
"""
