"""Where bytes live and how they are read and published: the bottom layer of packlab.

- :mod:`~packlab.storage.location`: URIs and filesystems, and a
  :class:`~packlab.storage.location.Location`, a local path or an object on object storage
  behind one API;
- :mod:`~packlab.storage.objects`: bytes moved between stores and the local cache (uploads
  through a temporary key, verified downloads, files fetched once into a cache entry);
- :mod:`~packlab.storage.files`: atomic publish (a temporary, then one rename), checksums,
  strict JSON;
- :mod:`~packlab.storage.reads`: reads of local files (``pread`` and read advice; memory maps
  for passes in file order).
"""
