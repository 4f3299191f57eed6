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
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from vtc_jax.core.errors import InputError

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


def target_problem(path) -> str | None:
    """Why an output file cannot be put at `path`, or None. An absent path, a regular file
    and a symbolic link to a regular file are fine; anything else (a directory, a device
    such as /dev/null, a FIFO, a socket, a dangling link) would be replaced by a regular
    file, so it is refused. Only lstat/stat are used: a FIFO is never opened (that blocks)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot check it ({err.strerror or err})"
    if stat.S_ISLNK(mode):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            return "it is a dangling symbolic link"
        except OSError as err:
            return f"cannot follow its symbolic link ({err.strerror or err})"
    if stat.S_ISREG(mode):
        return None
    return f"it is {_kind(mode)}, not a regular file"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def check_target(path) -> Path:
    """`path` as an output target (InputError naming it when `target_problem` finds one)."""
    problem = target_problem(path)
    if problem:
        raise InputError(f"cannot write {path}: {problem}")
    return Path(path)


def check_distinct_outputs(paths: Iterable) -> list[Path]:
    """The given output paths (None entries skipped), refused with InputError naming both
    when two of them are one file (compared resolved: `a/x.json` and `./a/../a/x.json`, or
    a link and its target). Call it before the run; the writer checks again."""
    seen: dict[str, Path] = {}
    out = []
    for path in paths:
        if path is None:
            continue
        path = Path(path)
        real = os.path.realpath(path)
        if real in seen:
            raise InputError(f"{seen[real]} and {path} name the same output file: give each output its own path")
        seen[real] = path
        out.append(path)
    return out


@contextlib.contextmanager
def _probe(parent: Path):
    """A throwaway file in `parent` (it is removed even on Ctrl-C: the handler raises here)."""
    _writing[0] += 1
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".vtc_jax_probe_"):
            yield
    finally:
        _writing[0] -= 1


def check_dir_possible(directory, names: Iterable[str] = ()) -> None:
    """What `check_writable_dir` refuses, as far as it can be told without creating
    anything: the directory's nearest existing ancestor is a writable directory, and where
    the directory exists, each of `names` is a valid target there (InputError otherwise).
    For checks made before other flags are validated: a refused command leaves no path."""
    directory = Path(directory)
    probe = directory
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if os.path.lexists(probe) and not probe.is_dir():
        raise InputError(f"cannot write to {directory} ({probe} is not a directory)")
    if probe.is_dir() and not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"cannot write to {directory} (permission denied)")
    if directory.is_dir():
        check_distinct_outputs([check_target(directory / name) for name in names])


def check_writable_dir(directory, names: Iterable[str] = ()) -> Path:
    """Create `directory` if needed and check that files can be created in it and that
    each of `names` (the files the command will write there) is a valid target, before any
    work is spent (InputError naming the problem otherwise)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _probe(directory):
            pass
    except OSError as err:
        raise InputError(f"cannot write to {directory} ({err.strerror or err})") from None
    check_distinct_outputs([check_target(directory / name) for name in names])
    return directory


def check_writable_file(path) -> Path:
    """Check that `path` can be written (its directory exists and is writable, and it is
    absent, a regular file or a link to one) before any work is spent."""
    path = check_target(path)
    parent = Path(os.path.realpath(path)).parent
    if not parent.is_dir():
        raise InputError(f"cannot write {path} (no such directory: {path.parent if str(path.parent) else '.'})")
    try:
        with _probe(parent):
            pass
    except OSError as err:
        raise InputError(f"cannot write {path} ({err.strerror or err})") from None
    return path


# The process's writer state, read by the signal handler in cli_common: how many
# write_outputs_atomically calls are in progress, whether a set is being renamed into
# place, the signal number of an interrupt received (0: none; kept even when the exception
# the handler raised was swallowed), and how many output files were put in place.
_writing = [0]
_renaming = [False]
_interrupt = [0]
_placed = [0]


def writing() -> bool:
    """Whether outputs are being written now (a Ctrl-C must then let the writer clean up)."""
    return _writing[0] > 0


def renaming() -> bool:
    """Whether a set is being renamed into place (an interrupt must then wait for its end:
    raised between two renames it would leave half a set)."""
    return _renaming[0]


def record_interrupt(signum: int) -> None:
    """Note that the process was asked to stop (a signal handler calls this)."""
    _interrupt[0] = _interrupt[0] or int(signum)


def pending_interrupt() -> int:
    """The signal number of the first recorded interrupt, 0 when none."""
    return _interrupt[0]


def outputs_placed() -> int:
    """How many output files this process has put in place (each in a complete set)."""
    return _placed[0]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _final_targets(finals: Sequence[Path]) -> list[Path]:
    """The paths the temporaries are renamed over: each checked (`check_target`), links to a
    regular file resolved (the file is replaced, the link kept), no two the same file."""
    check_distinct_outputs(finals)
    return [Path(os.path.realpath(f)) if os.path.islink(check_target(f)) else f for f in finals]


def write_outputs_atomically(files: Iterable[tuple[Path, Callable]]) -> list[Path]:
    """Write a set of files as a whole. `files` yields (final path, writer) pairs; each
    writer gets a temporary path in the same directory and writes it. Every final path is
    checked first (absent, a regular file or a link to one; no two the same file). Only
    when every writer succeeded, and no interrupt was received meanwhile, are the
    temporaries given the umask's mode (like `open(path, "w")`) and renamed over their
    final paths (each rename is atomic; an interrupt waits for the last); on any failure
    every temporary is removed and the error re-raised (OSError becomes InputError naming
    the file). Returns the final paths as given."""
    files = [(Path(final), writer) for final, writer in files]
    named = [final for final, _ in files]
    targets = _final_targets(named)
    mode = 0o666 & ~_umask()
    pending: list[tuple[Path, Path]] = []
    _writing[0] += 1
    try:
        for (final, writer), target in zip(files, targets):
            try:
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
                os.close(fd)
                pending.append((Path(tmp), target))
                writer(Path(tmp))
                os.chmod(tmp, mode)
            except OSError as err:
                raise InputError(f"cannot write {final} ({err.strerror or err})") from None
            if pending_interrupt():
                raise KeyboardInterrupt
        _final_targets(named)  # again: a target may have changed while the files were written
        if pending_interrupt():  # the exception raised by the handler may have been swallowed
            raise KeyboardInterrupt
        _renaming[0] = True
        try:
            for (tmp, target), final in zip(pending, named):
                try:
                    os.replace(tmp, target)
                except OSError as err:
                    raise InputError(f"cannot write {final} ({err.strerror or err})") from None
                _placed[0] += 1
        finally:
            _renaming[0] = False
        if pending_interrupt():  # received during the renames: the set is whole, now stop
            raise KeyboardInterrupt
        return named
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
