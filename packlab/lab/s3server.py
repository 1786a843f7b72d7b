"""A local S3-compatible server (moto) for tests and notebooks, bound to 127.0.0.1, with counters.

Why a child process: the client under measurement (pyarrow's S3 filesystem, DuckDB) then
competes with the server for neither the GIL nor the event loop, and a test can kill a writer
while the server keeps running. Why counters inside the server: what crosses the wire is the
truth about a read path. Every S3 request is counted by a WSGI middleware in front of moto
(method, key, status, ``Range`` asked, body bytes sent back and received), so "how many
requests and bytes does one random Parquet access cost" is answered by the server, not by
wrapping the client and trusting it.

Usage::

    with S3Server() as server:                  # picks a free port, waits until it answers
        fs = server.filesystem()                # pyarrow.fs.S3FileSystem on it (http, fake keys)
        server.create_bucket("lab")
        server.reset_counts()
        ...                                     # any S3 client, e.g. storage.resolve("s3://lab/x")
        server.counts()                         # {"requests": 3, "bytes_out": 81234, ...}
    # stopped: the child is terminated (killed if it does not exit), the port released

The port is chosen by the child (it binds port 0 and reports the number on its first line),
so two servers never race for a port. ``S3Server.configure()`` (done by ``start``) points
:mod:`packlab.storage.location` at it, so ``s3://`` URIs resolve to this server in this process;
``stop`` restores the previous configuration.

Run by hand (``python -m packlab.lab.s3server --help``): ``--port`` and ``--bucket`` to try
packlab's ``s3://`` paths against a store on this machine; it prints ``PORT <n>``, then on
stderr the environment another shell needs, and serves until it is stopped (Ctrl-C, a
signal), whatever becomes of the shell that started it (README, "Object storage, step by
step"). A server :class:`S3Server` starts (``--exit-with-parent``) exits with the process
that started it instead: a killed test or kernel leaves no server behind.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from packlab.errors import PacklabError

HOST = "127.0.0.1"
ACCESS_KEY = "packlab-test"
SECRET_KEY = "packlab-test-secret"
REGION = "us-east-1"
STATS_PATH = "/_packlab/stats"
RESET_PATH = "/_packlab/reset"
MAX_LOGGED = 100_000  # requests kept in the log (the counters have no limit)
STATS_WAIT_S = 2.0  # how long a stats request waits for requests in flight
START_TIMEOUT_S = 60.0


# -- the server side (child process) -----------------------------------------------------------
class CountingMiddleware:
    """WSGI middleware: counts every request moto serves, with the bytes in and out."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Condition()
        self.in_flight = 0
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.log: list[dict[str, Any]] = []
            self.totals = {"requests": 0, "bytes_out": 0, "bytes_in": 0}

    def stats(self) -> dict[str, Any]:
        """Totals and log, once the requests in flight have finished (a client may read its
        whole response before the server thread leaves the body iterator and counts it)."""
        with self.lock:
            self.lock.wait_for(lambda: self.in_flight == 0, timeout=STATS_WAIT_S)
            return {**self.totals, "log": [dict(e) for e in self.log]}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in (STATS_PATH, RESET_PATH):
            if path == RESET_PATH:
                with self.lock:
                    self.lock.wait_for(lambda: self.in_flight == 0, timeout=STATS_WAIT_S)
                    self.reset()
            body = json.dumps(self.stats()).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        entry = self._arrived(environ)

        def recording_start(code: str, headers: Any, *exc: Any) -> Any:
            entry["status"] = int(code.split()[0])
            return start_response(code, headers, *exc)

        try:
            chunks = self.app(environ, recording_start)
        except BaseException:
            self._done(entry, 0)
            raise
        return self._count(entry, chunks)

    def _arrived(self, environ: dict[str, Any]) -> dict[str, Any]:
        """Log a request as it arrives: the log is in the order the server received requests.
        (Logged when done, a request whose response the client had already read could be
        logged after the client's next request: threads finish in any order.)"""
        entry = {
            "method": environ.get("REQUEST_METHOD", ""),
            "path": environ.get("PATH_INFO", ""),
            "query": environ.get("QUERY_STRING", ""),
            "range": environ.get("HTTP_RANGE"),
            "status": 0,
            "bytes_out": 0,
            # aws-chunked uploads announce the payload size in their own header
            "bytes_in": int(environ.get("HTTP_X_AMZ_DECODED_CONTENT_LENGTH")
                            or environ.get("CONTENT_LENGTH") or 0),
        }
        with self.lock:
            self.in_flight += 1
            if len(self.log) < MAX_LOGGED:
                self.log.append(entry)
        return entry

    def _count(self, entry: dict[str, Any], chunks: Iterable[bytes]) -> Iterator[bytes]:
        sent = 0
        try:
            for chunk in chunks:
                sent += len(chunk)
                yield chunk
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
            self._done(entry, sent)

    def _done(self, entry: dict[str, Any], sent: int) -> None:
        """Count a finished request (its entry is already in the log, where it arrived)."""
        with self.lock:
            entry["bytes_out"] = sent
            self.in_flight -= 1
            self.totals["requests"] += 1
            self.totals["bytes_out"] += sent
            self.totals["bytes_in"] += entry["bytes_in"]
            self.lock.notify_all()


def serve(host: str = HOST, port: int = 0, buckets: Iterable[str] = (),
          on_ready: Callable[[int], None] | None = None, *, exit_with_parent: bool = False
          ) -> None:
    """Serve moto on ``host:port`` (0: a free port) with ``buckets`` made, printing
    ``PORT <n>`` once listening (then ``on_ready(port)``), until interrupted (or, with
    ``exit_with_parent``, until the process that started it is gone)."""
    from moto.server import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    if host != HOST:
        raise PacklabError(f"the test server binds {HOST} only, not {host}")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request: counted, not told
    # moto's S3 application alone, not its every-service dispatcher: that one looks for each
    # request's service anew (a listing of moto's package folder per request, a third of the
    # server's CPU), and this store serves S3 only. Flask's debug mode (moto turns it on)
    # builds a class per request to explain form errors nobody here reads.
    s3 = create_backend_app("s3")
    s3.debug = False
    app = CountingMiddleware(s3)
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    if exit_with_parent:
        threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    if buckets:
        import pyarrow.fs as pafs

        store = pafs.S3FileSystem(endpoint_override=f"{HOST}:{server.server_port}",
                                  scheme="http", access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                                  region=REGION, allow_bucket_creation=True)
        for bucket in buckets:
            store.create_dir(bucket)
    print(f"PORT {server.server_port}", flush=True)
    if on_ready is not None:
        on_ready(server.server_port)
    try:
        serving.join()
    finally:
        server.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m packlab.lab.s3server``: a store to try ``s3://`` paths on, by hand."""
    parser = argparse.ArgumentParser(
        prog="python -m packlab.lab.s3server", allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=f"A local S3-compatible store (moto) to try packlab's s3:// paths on: it "
                    f"listens on {HOST} only, keeps every object in memory (gone when it "
                    f"stops) and takes one fixed pair of keys. It prints PORT and the port "
                    f"number on stdout, then on stderr the environment that points packlab "
                    f"(in another shell) at it. It serves until it is stopped: Ctrl-C in its "
                    f"shell, or `kill PID` (started with `&`, `kill %1`); the shell that "
                    f"started it may exit first (nohup, setsid), it keeps serving.")
    parser.add_argument("--port", type=int, default=0,
                        help="the port to listen on; 0 picks a free one")
    parser.add_argument("--bucket", action="append", default=argparse.SUPPRESS, metavar="NAME",
                        help="a bucket to create at start (repeat for more; default: none)")
    parser.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.bucket = getattr(args, "bucket", [])
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")

    def tell(port: int) -> None:
        env = {"AWS_ENDPOINT_URL_S3": f"http://{HOST}:{port}", "AWS_ACCESS_KEY_ID": ACCESS_KEY,
               "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION}
        made = f" with bucket{'s' if len(args.bucket) > 1 else ''} {', '.join(args.bucket)}" \
            if args.bucket else ""
        print(f"s3server: serving s3:// at http://{HOST}:{port}{made} (in memory; until "
              f"Ctrl-C or `kill {os.getpid()}`). In another shell:\n  export "
              + " ".join(f"{k}={v}" for k, v in env.items()), file=sys.stderr, flush=True)

    try:
        serve(port=args.port, buckets=args.bucket, on_ready=tell,
              exit_with_parent=args.exit_with_parent)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"s3server: error: cannot listen on {HOST}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    return 0


def _exit_with_parent(parent: int) -> None:
    """A server whose parent died (a killed test or kernel) exits instead of lingering."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


# -- the client side ---------------------------------------------------------------------------
class S3Server:
    """A moto server in a child process on 127.0.0.1, as a context manager (always stopped)."""

    def __init__(self, *, configure: bool = True) -> None:
        self.port = 0
        self.process: subprocess.Popen[str] | None = None
        self._configure = configure
        self._previous: Any = None

    @property
    def endpoint(self) -> str:
        """``host:port`` (what pyarrow's ``endpoint_override`` takes)."""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def options(self) -> dict[str, Any]:
        """The S3 settings that reach this server (see :func:`packlab.storage.location.configure`)."""
        return {"endpoint_override": self.endpoint, "scheme": "http", "access_key": ACCESS_KEY,
                "secret_key": SECRET_KEY, "region": REGION}

    def environment(self) -> dict[str, str]:
        """The environment a separate process (``packlab`` on the command line, a worker)
        needs for ``s3://`` to reach this server: the endpoint (read by
        :mod:`packlab.storage.location`) and the keys (read by pyarrow)."""
        return {"AWS_ENDPOINT_URL_S3": f"http://{self.endpoint}", "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION}

    def start(self) -> S3Server:
        if self.process is not None:
            raise PacklabError(f"S3 server already running on {self.endpoint}")
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "AWS_DEFAULT_REGION": REGION, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "packlab.lab.s3server", "--exit-with-parent"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env,
        )
        atexit.register(self.stop)  # a notebook or script that never reaches stop()
        try:
            self.port = self._read_port(self.process)
            self._wait_ready()
            if self._configure:
                from packlab.storage import location as storage

                self._previous = storage.configure("s3", **self.options())
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _read_port(process: subprocess.Popen[str]) -> int:
        """The port the child reports, or a clear error if it dies or stays silent."""
        assert process.stdout is not None
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(process.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        line = found[0] if found else ""
        if not line.startswith("PORT "):
            raise PacklabError(f"moto server did not start (exit code {process.poll()}); is "
                               "`moto[server]` installed?")
        return int(line.split()[1])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.counts()
                return
            except OSError:
                if time.monotonic() > deadline or (self.process and self.process.poll() is not None):
                    raise PacklabError(f"moto server on {self.endpoint} does not answer") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the child (kill it after 5 s), restore the storage configuration."""
        process, self.process = self.process, None
        atexit.unregister(self.stop)
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._configure and self._previous is not None:
            from packlab.storage import location as storage

            storage.configure("s3", **self._previous, replace=True)
            self._previous = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- what the server saw ----------------------------------------------------------------
    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as response:  # noqa: S310
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        """Totals and the log of requests since the last reset."""
        return self._get(STATS_PATH)

    def counts(self) -> dict[str, int]:
        """``requests``, ``bytes_out`` (bodies sent to clients), ``bytes_in`` (bodies received)."""
        stats = self.stats()
        return {k: int(stats[k]) for k in ("requests", "bytes_out", "bytes_in")}

    def reset_counts(self) -> None:
        self._get(RESET_PATH)

    @contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        """``with server.measure() as m: ...``: then ``m`` holds the block's ``requests``,
        ``bytes_out``, ``bytes_in`` (as the server counted them) and wall ``seconds``."""
        self.reset_counts()
        out: dict[str, float] = {}
        began = time.perf_counter()
        yield out
        out["seconds"] = time.perf_counter() - began
        out.update(self.counts())

    # -- conveniences -----------------------------------------------------------------------
    def filesystem(self, **options: Any) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` on this server (bucket creation allowed)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(**{**self.options(), "allow_bucket_creation": True,
                                    "allow_bucket_deletion": True, **options})

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (no error if it exists); returns ``s3://name``."""
        self.filesystem().create_dir(name)
        return f"s3://{name}"


if __name__ == "__main__":
    sys.exit(main())
