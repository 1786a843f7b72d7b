"""Where bytes live and how they are read and published: the bottom layer of packlab.

- :mod:`~packlab.storage.location`: a :class:`~packlab.storage.location.Location`, a local path
  or an object on object storage behind one API;
- :mod:`~packlab.storage.files`: atomic publish (a temporary, then one rename), checksums,
  strict JSON;
- :mod:`~packlab.storage.reads`: reads of local files (``pread`` and read advice; memory maps
  for passes in file order).
"""
