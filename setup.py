"""packlab's one compiled piece, ``packlab/_views.c`` (``dataset[i]`` of a memory-mapped shard);
everything else about the package is in pyproject.toml.

The extension is optional: where no C compiler is found the install goes on, and packlab reads
through its Python closures (the same items, ~0.4 µs a read slower;
``packlab.formats.bintable.CompiledReader`` is then None).
"""

import numpy
from setuptools import Extension, setup

setup(ext_modules=[Extension("packlab._views", ["packlab/_views.c"],
                             include_dirs=[numpy.get_include()], optional=True)])
