"""The read path shared by every format whose bins are runs of values in its files.

- :mod:`~packlab.formats.read.table`: three columns and a bin index, read by ``pread``;
- :mod:`~packlab.formats.read.item_table`: a format that stores one item per bin;
- :mod:`~packlab.formats.read.ranged`: the same columns on object storage, by ranged GETs.
"""
