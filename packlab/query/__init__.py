"""SQL over packed Parquet shards with DuckDB, and the same questions through polars.

- :mod:`~packlab.query.sources`: which shards (a layout's splits, a directory, a glob);
- :mod:`~packlab.query.views`: ``connect(data)``: DuckDB with ``shards``, ``bins``,
  ``sequences``, ``violations`` and an opt-in ``tokens`` view;
- :mod:`~packlab.query.run`: execute SQL, errors as one line, rows in batches;
- :mod:`~packlab.query.questions`: the dataset card and named questions in SQL and in polars;
- :mod:`~packlab.query.lazy`: polars lazy frames over the same shards;
- :mod:`~packlab.lab.measure.queries`: the questions as measured jobs (time and peak RSS, fresh process).

``packlab query "SELECT split, count(*) FROM bins GROUP BY split" --data OUT``.
"""

from __future__ import annotations

from packlab.query.run import Result, execute, query
from packlab.query.sources import Shard, resolve_sources
from packlab.query.views import VIEWS, connect

__all__ = ["VIEWS", "Result", "Shard", "connect", "execute", "query", "resolve_sources"]
