"""The lab: what packlab measures and reports, on top of the core.

Nothing in the core (``packlab`` outside this package) imports it. Here: every measurement
(:mod:`.measure`, the side-by-side peers in :mod:`.measure.peers`), the notebooks' runner
(:mod:`.notebooks`), the words every summary prints (:mod:`.summaries`), the HTML report
(:mod:`.report`), the training study (:mod:`.train`), JupyterLab (:mod:`.jupyter`), the
notebooks' helpers (:mod:`.results`, :mod:`.plots`, :mod:`.tables`), the local S3 server
tests and notebooks start (:mod:`.s3server`), the reproductions of the design documents'
per-rank loader (:mod:`.per_rank`) and a shard's deliberate damage (:mod:`.tamper`).
"""
