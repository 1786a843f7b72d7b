"""Read pickles from files without running code: pickled ``.npy`` files, and plain lists.

``np.load(path, allow_pickle=True)`` hands the pickle stream to :mod:`pickle`, which imports and
calls whatever the file names: a shard from the internet can run ``os.system``. Here the
``.npy`` header is parsed with :mod:`numpy.lib.format` (its parser uses ``ast.literal_eval``,
no code), and the pickle stream goes to :class:`RestrictedUnpickler`, whose ``find_class``
knows exactly the globals ``np.save`` of a list of dicts of lists/arrays emits (see
:data:`ALLOWED`) and refuses every other one with a :class:`UnsafePickleError` naming the file
and the global. Dicts, lists, ints and strings are pickle opcodes and need no global at all.
Even the allowed names resolve to checking stand-ins, not numpy's constructors: numpy trusts
the state it is handed, and a damaged stream can crash it.

Any other failure of a corrupted stream (truncation, flipped bits: the unpickler can raise
almost any exception type) becomes a :class:`~packlab.errors.FormatError` naming the file.
One failure is not an exception: a memo index far beyond the stream's objects (one flipped byte
of a ``LONG_BINPUT``) makes CPython's unpickler size its memo to twice that index before
storing anything (8 bytes an entry: 20 GB for an index of 1.26 billion), so the process swaps or
is killed. So every stream is walked once before it is loaded (:func:`check_memo`, opcodes
read with :mod:`pickletools`' argument readers) and such an index is refused, naming the byte.

:func:`restricted_load` with :data:`NO_GLOBALS` reads a pickle of plain lists, tuples and ints
(the Modalities pbin index, :mod:`packlab.formats.pbin.codec`) and refuses every global.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import pickle
import pickletools
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, BinaryIO, NamedTuple

import numpy as np
from numpy.lib import format as npy_format

from packlab.errors import FormatError, PacklabError, one_line
from packlab.storage.location import as_location

# -- the only objects a pickle may name ------------------------------------------------------
# numpy's own pickle constructors are not enough: a damaged or crafted stream can hand
# ``ndarray.__setstate__`` an object list shorter than the shape (numpy 2.4 then reads past
# the list: a segfault) or give a dtype state that clears its "holds objects" flag. So the
# names resolve to stand-ins that check every argument and state, then build the real thing.

_DTYPE_CODES = frozenset({"O8", "b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"})


class _Callable:
    """A named constructor the pickle may call; it refuses a BUILD onto itself."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn: Any) -> None:
        self.name, self.fn = name, fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __setstate__(self, state: Any) -> None:
        raise ValueError(f"state applied to {self.name}")


class _DtypeSpec:
    """What a pickled ``numpy.dtype`` may be: a plain integer, bool or object code."""

    __slots__ = ("code", "byteorder")

    def __init__(self, code: Any, align: Any = False, copy: Any = True) -> None:
        if type(code) is not str or code not in _DTYPE_CODES:
            raise ValueError(f"dtype {code!r} is not one packed data uses")
        self.code, self.byteorder = code, None

    def __setstate__(self, state: Any) -> None:
        ok = (type(state) is tuple and len(state) in (8, 9) and state[1] in ("<", ">", "|", "=")
              and state[2:5] == (None, None, None) and self.byteorder is None)
        if not ok:
            raise ValueError(f"unexpected dtype state {state!r:.80}")
        self.byteorder = state[1]

    def dtype(self) -> np.dtype:
        dtype = np.dtype(self.code)
        return dtype.newbyteorder(self.byteorder) if self.byteorder in ("<", ">") else dtype


def _as_dtype(spec: Any) -> np.dtype:
    if not isinstance(spec, _DtypeSpec):
        raise ValueError(f"expected a dtype, got {type(spec).__name__}")
    return spec.dtype()


class CheckedArray(np.ndarray):
    """An ndarray whose pickled state is checked before numpy sees it."""

    def __setstate__(self, state: Any) -> None:
        if type(state) is not tuple or len(state) not in (4, 5):
            raise ValueError("unexpected ndarray state")
        version, shape, spec, fortran, data = state if len(state) == 5 else (1, *state)
        if type(shape) is not tuple or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"bad array shape {shape!r:.80}")
        dtype = _as_dtype(spec)
        count = math.prod(shape)  # Python ints: an int64 product could wrap to match the data
        if dtype == np.dtype(object):
            if type(data) is not list or len(data) != count:
                raise ValueError(f"object array of shape {shape} pickled with "
                                 f"{len(data) if type(data) is list else type(data).__name__}")
        elif type(data) is not bytes or len(data) != count * dtype.itemsize:
            raise ValueError(f"{dtype} array of shape {shape}: data does not match")
        super().__setstate__((version, shape, dtype, bool(fortran), data))


class _Marker:
    """Stands for ``numpy.ndarray`` as the first argument of ``_reconstruct``."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise ValueError("state applied to numpy.ndarray")


_NDARRAY = _Marker()


def _reconstruct(subtype: Any, shape: Any, typecode: Any) -> CheckedArray:
    if subtype is not _NDARRAY or shape != (0,) or typecode != b"b":
        raise ValueError("unexpected array constructor arguments")
    return np.ndarray.__new__(CheckedArray, (0,), np.int8)


def _scalar(spec: Any, data: Any = None) -> Any:
    dtype = _as_dtype(spec)
    if dtype == np.dtype(object):
        return data
    if type(data) is not bytes or len(data) != dtype.itemsize:
        raise ValueError(f"{dtype} scalar with {type(data).__name__} data")
    return np.frombuffer(data, dtype=dtype)[0]


_RECONSTRUCT = _Callable("numpy._core.multiarray._reconstruct", _reconstruct)
_SCALAR = _Callable("numpy._core.multiarray.scalar", _scalar)
_DTYPE = _Callable("numpy.dtype", _DtypeSpec)

# (module, name) -> stand-in. numpy 1.x pickles name ``numpy.core``, numpy 2.x ``numpy._core``.
ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,  # an ndarray (object or numeric)
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.multiarray", "scalar"): _SCALAR,  # a numpy scalar in a list (np.int64(5))
    ("numpy._core.multiarray", "scalar"): _SCALAR,
    ("numpy", "ndarray"): _NDARRAY,  # the type _reconstruct builds
    ("numpy", "dtype"): _DTYPE,  # the dtype of each array or scalar
}

MAX_HEADER_SIZE = 10_000


class UnsafePickleError(FormatError):
    """The pickle names a global outside :data:`ALLOWED` (it could run code); it was not loaded."""


# Why the globals of :data:`ALLOWED` are the only ones a packed-data pickle needs.
PACKED_DATA = "packed data needs only numpy arrays, dtypes, lists and dicts"
NO_GLOBALS: Mapping[tuple[str, str], Any] = MappingProxyType({})


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ``allowed`` (:data:`ALLOWED` by default;
    :data:`NO_GLOBALS` for a stream of plain lists, tuples and ints) and refuses any other,
    saying why none is needed (``needs``) and naming the stream (``what``)."""

    def __init__(self, file: BinaryIO, *, source: str,
                 allowed: Mapping[tuple[str, str], Any] = ALLOWED, needs: str = PACKED_DATA,
                 what: str = "pickle") -> None:
        super().__init__(file)
        self.source, self.allowed, self.needs, self.what = source, allowed, needs, what

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.allowed[(module, name)]
        except (KeyError, TypeError):
            raise UnsafePickleError(
                f"{self.source}: refused to unpickle global {module}.{name}: {self.needs} "
                "(the file may try to run code)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"{self.source}: refused a persistent id in the {self.what}")


def restricted_load(fp: BinaryIO, *, source: str,
                    allowed: Mapping[tuple[str, str], Any] = ALLOWED, needs: str = PACKED_DATA,
                    what: str = "pickle") -> Any:
    """Run :class:`RestrictedUnpickler` on the rest of ``fp``: an :class:`UnsafePickleError` for
    a refused global, a FormatError naming ``source`` and ``what`` for any damage (a corrupted
    stream can raise almost any exception type; a flipped length field ends in a clean
    "truncated" or MemoryError). Read straight from the file, so the load costs the objects,
    not a second copy of the bytes."""
    check_memo(fp, source=source, what=what)
    try:
        return RestrictedUnpickler(fp, source=source, allowed=allowed, needs=needs,
                                   what=what).load()
    except PacklabError:
        raise
    except RecursionError:
        raise FormatError(f"{source}: corrupted {what} (nested too deeply)") from None
    except Exception as exc:  # noqa: BLE001 - a corrupted stream raises almost any type
        raise FormatError(
            f"{source}: corrupted or truncated {what}: {type(exc).__name__}: {exc}"
        ) from None


# Runs of opcodes with no argument or a fixed-size one that cannot make the memo large (ints,
# tuples, marks, appends, memo reads, MEMOIZE, BINPUT's one-byte index): skipped by one match
# of a regular expression, so the walk makes a Python step per string, frame or global, not
# per int of a token list (about 100 ns an opcode: a list of ints walks in 1-1.5x its load).
_PLAIN_RUN = re.compile(
    rb"(?:(?:J[\x00-\xff]{4})++|(?:K[\x00-\xff])++|(?:M[\x00-\xff]{2})++"
    rb"|j[\x00-\xff]{4}|[hq][\x00-\xff]|[\x85\x86\x87\x94(eaus\]})\x88\x89NtldbR\x93]++)++")
_LONG_BINPUT = ord("r")
_PUT_BY_INDEX = frozenset({"PUT", "LONG_BINPUT"})


class _Cursor:
    """The two calls :mod:`pickletools`' argument readers make, over a buffer."""

    __slots__ = ("buffer", "at")

    def __init__(self, buffer: Any, at: int) -> None:
        self.buffer, self.at = buffer, at

    def read(self, n: int) -> bytes:
        data = bytes(self.buffer[self.at:self.at + n])
        self.at += len(data)
        return data

    def readline(self) -> bytes:
        end = self.buffer.find(b"\n", self.at)
        end = len(self.buffer) if end < 0 else end + 1
        return self.read(end - self.at)


def check_memo(fp: BinaryIO, *, source: str, what: str = "pickle") -> None:
    """Refuse a pickle that stores a memo entry under an index beyond the bytes before it (no
    pickler numbers its entries faster than one a byte: the index is damage, and the unpickler
    would allocate memory for every index below it); ``fp`` is left where it was. The walk
    reads the stream's opcodes in place (a map of the file, or a BytesIO's buffer)."""
    start = fp.tell()
    if isinstance(fp, io.BytesIO):  # getvalue shares the bytes it was made from
        _walk(fp.getvalue(), start, source, what)
        return
    with mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        _walk(buffer, start, source, what)


def _walk(buffer: Any, start: int, source: str, what: str) -> None:
    at, end = start, len(buffer)
    while at < end:
        run = _PLAIN_RUN.match(buffer, at)
        if run is not None:
            at = run.end()
            continue
        if buffer[at] == _LONG_BINPUT and at + 5 <= end:  # a protocol-2/3 pickle's every object
            _check_index(int.from_bytes(buffer[at + 1:at + 5], "little"), at, start, source, what)
            at += 5
            continue
        opcode = pickletools.code2op.get(chr(buffer[at]))
        if opcode is None:
            raise FormatError(f"{source}: corrupted {what}: opcode {buffer[at]:#04x} at byte {at}")
        cursor = _Cursor(buffer, at + 1)
        try:
            arg = opcode.arg.reader(cursor) if opcode.arg is not None else None
        except ValueError as exc:
            raise FormatError(f"{source}: corrupted or truncated {what}: {opcode.name} at byte "
                              f"{at}: {one_line(exc, 200)}") from None
        if opcode.name in _PUT_BY_INDEX:
            _check_index(int(arg), at, start, source, what)
        if opcode.name == "STOP":
            return
        at = cursor.at
    raise FormatError(f"{source}: truncated {what}: no STOP opcode")


def _check_index(index: int, at: int, start: int, source: str, what: str) -> None:
    if index > at - start:
        raise FormatError(f"{source}: corrupted {what}: memo index {index} at byte {at}, "
                          f"{at - start} bytes into the stream")


class NpyHeader(NamedTuple):
    """What the ``.npy`` header says, and where the data starts."""

    version: tuple[int, int]
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype
    data_offset: int


def read_npy_header(fp: BinaryIO, *, source: str) -> NpyHeader:
    """Parse the magic and header of an open ``.npy`` file; a FormatError naming ``source``."""
    try:
        version = npy_format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(
                fp, max_header_size=MAX_HEADER_SIZE)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(
                fp, max_header_size=MAX_HEADER_SIZE)
        else:
            raise FormatError(f"{source}: .npy format version {version} not supported")
    except PacklabError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy's parser raises what its tokenizer and
        # ast.literal_eval raise on damaged bytes (TokenError, SyntaxError, ValueError, ...)
        detail = one_line(exc, 200)
        raise FormatError(f"{source}: not a valid .npy file: {type(exc).__name__}: {detail}"
                          ) from None
    return NpyHeader(version, tuple(shape), bool(fortran), np.dtype(dtype), fp.tell())


def load_pickled_npy(path: str | os.PathLike[str]) -> np.ndarray:
    """The object array stored in a pickled ``.npy`` file, loaded without running any code.

    Raises :class:`UnsafePickleError` for a forbidden global and :class:`FormatError` for
    anything else wrong (not an object array, truncated, corrupted).
    """
    source = str(path)
    try:
        fp = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise FormatError(f"{source}: cannot open: {exc.strerror}") from None
    with fp:
        header = read_npy_header(fp, source=source)
        if header.dtype != np.dtype(object):
            raise FormatError(
                f"{source}: dtype {header.dtype}, not a pickled object array "
                "(a legacy packed file is np.save of a list of dicts)"
            )
        array = restricted_load(fp, source=source)
        if fp.read(1):
            raise FormatError(f"{source}: stray bytes after the pickle (corrupted)")
    if type(array) is not CheckedArray or array.dtype != np.dtype(object):
        raise FormatError(f"{source}: the pickle holds {type(array).__name__}, "
                          "not the object array the header announces")
    if array.shape != header.shape:
        raise FormatError(f"{source}: the pickle holds shape {array.shape}, "
                          f"the header says {header.shape}")
    return array.view(np.ndarray)


def npy_is_pickled(location: Any) -> bool:
    """True when ``location`` (a :class:`~packlab.storage.location.Location`) is a ``.npy`` file whose
    header announces an object array."""
    try:
        with as_location(location).open_input() as fp:
            return read_npy_header(fp, source=str(location)).dtype == np.dtype(object)
    except (OSError, PacklabError):
        return False
