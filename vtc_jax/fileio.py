"""Reading inputs with a stated size limit, and writing outputs atomically.

Every reader goes through `read_text`: a regular file larger than the limit is refused
before it is read, anything else (a pipe, /dev/zero) is read in chunks and refused as soon
as it passes the limit or shows a NUL byte, so no input can exhaust memory. Every writer
goes through `write_outputs_atomically`: files are written under temporary names in the
target directory and renamed into place only when all of them were written, so an
interrupted or failed run leaves the previous results (or none), never a half.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from vtc_jax.errors import InputError

MAX_INPUT_BYTES = 1 << 30  # 1 GiB: the largest trace or data file any command reads
_CHUNK = 1 << 20


def read_bytes(path, *, limit: int = MAX_INPUT_BYTES, what: str = "file") -> bytes:
    """The whole content of `path` (at most `limit` bytes), or InputError naming it."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            try:
                size = os.fstat(fh.fileno()).st_size
                regular = os.path.isfile(path)
            except OSError:
                size, regular = 0, False
            if regular and size > limit:
                raise InputError(f"{path}: {what} is {size:,} bytes, over the limit of {limit:,}")
            parts, total = [], 0
            while True:
                chunk = fh.read(_CHUNK)
                if not chunk:
                    break
                if not regular and b"\x00" in chunk:  # /dev/zero and the like: stop at once
                    raise InputError(f"{path}: not a text {what} (contains NUL bytes)")
                total += len(chunk)
                if total > limit:
                    raise InputError(f"{path}: {what} is over the limit of {limit:,} bytes")
                parts.append(chunk)
    except IsADirectoryError:
        raise InputError(f"{path}: cannot read {what} (is a directory)") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read {what} ({err.strerror or err})") from None
    return b"".join(parts)


def read_text(path, *, limit: int = MAX_INPUT_BYTES, what: str = "file") -> str:
    """`read_bytes` decoded as UTF-8 (a BOM is dropped); NUL bytes are refused."""
    try:
        text = read_bytes(path, limit=limit, what=what).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{os.fspath(path)}: not a UTF-8 text {what}") from None
    if "\x00" in text:
        raise InputError(f"{os.fspath(path)}: not a text {what} (contains NUL bytes)")
    return text


def csv_table(text: str, source: str, columns: Sequence[str],
              optional: Sequence[str] = ()) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """The header of CSV `text` (stripped names) and an iterator over its records as
    (physical line, stripped cells in header order); blank lines are skipped and quoted
    newlines counted. Every problem is an InputError naming `source` and the line: an empty
    file, a malformed header or row, a column that is unexpected (not in `columns` or
    `optional`), missing (from `columns`) or repeated, a row whose field count is not the
    header's. A `#` is an ordinary character, never a comment."""
    reader = csv.reader(io.StringIO(text, newline=""))
    expected = ",".join(columns) + "".join(f"[,{c}]" for c in optional)
    try:
        header = next(reader)
        while not any(cell.strip() for cell in header):
            header = next(reader)
    except StopIteration:
        raise InputError(f"{source}: empty file (expected header {expected})") from None
    except csv.Error as err:
        raise InputError(f"{source}: line {reader.line_num}: malformed CSV header ({err})") from None
    header = [h.strip() for h in header]
    unexpected = [c for c in header if c not in columns and c not in optional]
    missing = [c for c in columns if c not in header]
    if unexpected:
        also = f" and missing column {missing[0]!r}" if missing else ""
        raise InputError(f"{source}: unexpected column {unexpected[0][:40]!r}{also} (expected {expected})")
    if missing:
        raise InputError(f"{source}: missing column {missing[0]!r} (header: {','.join(header)[:200]})")
    if len(set(header)) != len(header):
        raise InputError(f"{source}: duplicate column in header {','.join(header)[:200]}")
    return header, _csv_records(reader, source, len(header))


def _csv_records(reader, source: str, width: int) -> Iterator[tuple[int, list[str]]]:
    line = reader.line_num
    try:
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            line = start
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != width:
                raise InputError(f"{source}: line {line}: {len(row)} fields, header has {width}")
            yield line, [cell.strip() for cell in row]
    except csv.Error as err:
        raise InputError(f"{source}: line {line}: malformed CSV ({err})") from None


def check_writable_dir(directory) -> Path:
    """Create `directory` if needed and check that files can be created in it, before any
    work is spent (InputError naming it otherwise)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".vtc_jax_probe_"):
            pass
    except OSError as err:
        raise InputError(f"cannot write to {directory} ({err.strerror or err})") from None
    return directory


def check_writable_file(path) -> Path:
    """Check that `path` can be written (its directory exists and is writable) before any
    work is spent."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {path} (no such directory: {parent})")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".vtc_jax_probe_"):
            pass
    except OSError as err:
        raise InputError(f"cannot write {path} ({err.strerror or err})") from None
    return path


_writing = [0]  # write_outputs_atomically calls in progress (read by the Ctrl-C handler)


def writing() -> bool:
    """Whether outputs are being written now (a Ctrl-C must then let the writer clean up)."""
    return _writing[0] > 0


def write_outputs_atomically(files: Iterable[tuple[Path, Callable]]) -> list[Path]:
    """Write a set of files as a whole. `files` yields (final path, writer) pairs; each
    writer gets a temporary path in the same directory and writes it. Only when every
    writer succeeded are the temporaries renamed over their final paths (each rename is
    atomic); on any failure every temporary is removed and the error re-raised (OSError
    becomes InputError naming the file)."""
    pending: list[tuple[Path, Path]] = []
    _writing[0] += 1
    try:
        for final, writer in files:
            final = Path(final)
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
            os.close(fd)
            pending.append((Path(tmp), final))
            try:
                writer(Path(tmp))
            except OSError as err:
                raise InputError(f"cannot write {final} ({err.strerror or err})") from None
        for tmp, final in pending:
            os.replace(tmp, final)
        return [final for _, final in pending]
    except BaseException:
        for tmp, _ in pending:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
    finally:
        _writing[0] -= 1


def write_text_atomically(path, text: str) -> Path:
    """One text file, atomically."""
    return write_outputs_atomically([(Path(path), lambda tmp: tmp.write_text(text))])[0]
