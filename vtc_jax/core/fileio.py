"""Reading inputs with a stated size limit, and writing outputs atomically.

Every reader goes through `read_text`: a regular file larger than the limit is refused
before it is read, anything else (a pipe, /dev/zero) is read in chunks and refused as soon
as it passes the limit or shows a NUL byte, so no input can exhaust memory. Every writer
goes through `write_outputs_atomically`: files are written under temporary names in the
target directory and renamed into place only when all of them were written, so an
interrupted or failed run leaves the previous results (or none), never a half. A stream
target (`-` for stdout, a FIFO, a character device such as /dev/null or /dev/stdout) is
written as a stream: opened once and written after the regular files of its set are in
place, never replaced, renamed over or probed with a file beside it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import signal
import stat
import sys
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


STDOUT = "-"  # an output path that means this process's standard output
# Paths that name this process's own standard output: written through sys.stdout (opening
# them anew would truncate a redirected file under what the command prints).
_STDOUT_NAMES = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


def _target_mode(path) -> int | None:
    """The file type bits of what `path` names (a link followed), None when absent; raises
    ValueError with the reason a link cannot be followed or the path cannot be checked.
    Only lstat/stat are used: a FIFO is never opened (that blocks)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"cannot check it ({err.strerror or err})") from None
    if stat.S_ISLNK(mode):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise ValueError("it is a dangling symbolic link") from None
        except OSError as err:
            raise ValueError(f"cannot follow its symbolic link ({err.strerror or err})") from None
    return stat.S_IFMT(mode)


def is_stream(path) -> bool:
    """Whether output `path` is written as a stream: `-` (stdout), or a FIFO or character
    device (/dev/null, /dev/stdout, a terminal), a link to one followed."""
    if path is None:
        return False
    if os.fspath(path) == STDOUT:
        return True
    try:
        mode = _target_mode(path)
    except ValueError:
        return False
    return mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode))


def target_problem(path) -> str | None:
    """Why an output file cannot be put at `path`, or None. An absent path, a regular file
    and a symbolic link to a regular file are fine (written atomically), and so is a stream
    (`is_stream`: `-`, a FIFO, a character device; written as a stream); anything else (a
    directory, a socket, a block device, a dangling link) would be replaced by a regular
    file, so it is refused."""
    if os.fspath(path) == STDOUT:
        return None
    try:
        mode = _target_mode(path)
    except ValueError as err:
        return str(err)
    if mode is None or stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return None
    return f"it is {_kind(mode)}, not a regular file or a stream (a FIFO, a character device, - for stdout)"


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
        if _shared_stream(path):  # /dev/null or stdout named twice is two writes to one stream
            out.append(path)
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise InputError(f"{seen[real]} and {path} name the same output file: give each output its own path")
        seen[real] = path
        out.append(path)
    return out


def _shared_stream(path) -> bool:
    """A stream that several outputs may name: stdout or a character device (a FIFO is
    not: its reader sees one writer's end of file)."""
    if os.fspath(path) in _STDOUT_NAMES:
        return True
    try:
        mode = _target_mode(path)
    except ValueError:
        return False
    return mode is not None and stat.S_ISCHR(mode)


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
    if os.fspath(directory) == STDOUT:
        raise InputError(f"cannot write to {directory} (not a directory: this output is a directory of files)")
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
    if os.fspath(directory) == STDOUT or (os.path.exists(directory) and not directory.is_dir()):
        raise InputError(f"cannot write to {directory} (not a directory: this output is a directory of files)")
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
    absent, a regular file or a link to one) before any work is spent. A stream (`is_stream`)
    is checked for write permission only: nothing is created beside it, and a FIFO is not
    opened (that would wait for its reader)."""
    path = check_target(path)
    if is_stream(path):
        if os.fspath(path) != STDOUT and not os.access(path, os.W_OK):
            raise InputError(f"cannot write {path} (permission denied)")
        return path
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


_SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
COMMAND_PACKAGES = ("vtc_jax", "sweeps", "benchmarks")  # `python -m PACKAGE.X`: the commands


def interrupted_line(signum: int, placed: int) -> str:
    """The one line of a stopped command: which signal, and what was written (`placed`
    output files, each in a whole set, or none)."""
    name = _SIGNAL_NAMES.get(signum, f"signal {signum}")
    done = "no results were written" if not placed else \
        f"{placed} output file(s) had been written before, each set complete"
    return f"interrupted ({name}); {done}"


def command_prog(argv: Sequence[str] | None = None) -> str | None:
    """The name a command's messages start with when this process is `python -m NAME`
    of one of COMMAND_PACKAGES (`vtc_jax`, `python -m sweeps.rpm`), else None. Read from
    the interpreter's own command line (sys.orig_argv), which is whole before the module
    named by -m is even found."""
    argv = list(getattr(sys, "orig_argv", []) if argv is None else argv)
    i = 1
    while i < len(argv) - 1 and argv[i] != "-m":  # the interpreter's own options come first
        if argv[i] == "-c" or not argv[i].startswith("-"):
            return None  # a script or a command string, not a module
        i += 2 if argv[i] in ("-W", "-X", "--check-hash-based-pycs") else 1
    if i >= len(argv) - 1 or argv[i] != "-m":
        return None
    name = argv[i + 1]
    if name.split(".")[0] not in COMMAND_PACKAGES:
        return None
    return "vtc_jax" if name in ("vtc_jax", "vtc_jax.__main__") else f"python -m {name}"


def stop_early_on_signals(argv: Sequence[str] | None = None) -> bool:
    """In a command process (`command_prog`), from now until the command installs its own
    handler (cli/common.py `guarded`): Ctrl-C, SIGTERM and SIGHUP end it at once with one
    line and status 128 + signal. Called first thing by the package (vtc_jax/__init__.py),
    before the imports that take seconds (jax): Python's default there was a
    KeyboardInterrupt traceback from inside the import, an ImportError ("error while
    initializing the extension") or an interrupt lost in jax's garbage-collection callback.
    Nothing can have been written yet. Returns whether it installed the handlers."""
    prog = command_prog(argv)
    if prog is None:
        return False

    def handler(signum, frame):
        record_interrupt(signum)
        line = f"{prog}: error: {interrupted_line(signum, 0)}\n"
        with contextlib.suppress(OSError):
            os.write(2, line.encode())
        os._exit(128 + signum)

    try:
        for signum in _SIGNAL_NAMES:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # a signal the caller ignores stays ignored
                signal.signal(signum, handler)
    except ValueError:  # not the main thread: the command's own handler comes later
        return False
    return True


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
    writer gets a temporary path and writes it. Every final path is checked first (absent,
    a regular file, a link to one, or a stream; no two the same file). Only when every
    writer succeeded, and no interrupt was received meanwhile, are the regular files'
    temporaries (in their final directories) given the umask's mode (like `open(path, "w")`)
    and renamed over their final paths (each rename is atomic; an interrupt waits for the
    last); then each stream (`is_stream`: `-`, a FIFO, a character device), whose writer
    wrote into a private temporary directory, never beside the stream, is opened once and
    written. On any failure every temporary is removed and the error re-raised (OSError
    becomes InputError naming the file; a closed pipe stays BrokenPipeError). Returns the
    final paths as given."""
    files = [(Path(final), writer) for final, writer in files]
    named = [final for final, _ in files]
    streams = [is_stream(final) for final in named]
    regular = [final for final, stream in zip(named, streams) if not stream]
    check_distinct_outputs(named)
    targets = iter(_final_targets(regular))
    mode = 0o666 & ~_umask()
    pending: list[tuple[Path, Path]] = []  # (temporary beside the target, target): renamed
    spooled: list[tuple[Path, Path]] = []  # (temporary in `spool`, stream): copied
    spool: list[Path] = []
    _writing[0] += 1
    try:
        for (final, writer), stream in zip(files, streams):
            try:
                if stream:
                    if not spool:
                        spool.append(Path(tempfile.mkdtemp(prefix="vtc_jax_stream_")))
                    tmp = spool[0] / f"{len(spooled)}.out"
                    spooled.append((tmp, final))
                    writer(tmp)
                    continue
                target = next(targets)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
                os.close(fd)
                pending.append((Path(tmp), target))
                writer(Path(tmp))
                os.chmod(tmp, mode)
            except OSError as err:
                raise InputError(f"cannot write {final} ({err.strerror or err})") from None
            finally:
                if pending_interrupt():
                    raise KeyboardInterrupt
        _final_targets(regular)  # again: a target may have changed while the files were written
        if pending_interrupt():  # the exception raised by the handler may have been swallowed
            raise KeyboardInterrupt
        _place(pending, regular)
        for tmp, final in spooled:  # the regular files are in place: now the streams
            _copy_to_stream(tmp, final)
            _placed[0] += 1
            if pending_interrupt():
                raise KeyboardInterrupt
        return named
    except BaseException:
        for tmp, _ in pending:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
    finally:
        _writing[0] -= 1
        for directory in spool:
            shutil.rmtree(directory, ignore_errors=True)


def _place(pending: list[tuple[Path, Path]], finals: list[Path]) -> None:
    """Rename each temporary over its target, the whole set (an interrupt is only recorded
    meanwhile, and raised once the set is whole)."""
    _renaming[0] = True
    try:
        for (tmp, target), final in zip(pending, finals):
            try:
                os.replace(tmp, target)
            except OSError as err:
                raise InputError(f"cannot write {final} ({err.strerror or err})") from None
            _placed[0] += 1
    finally:
        _renaming[0] = False
    if pending_interrupt():  # received during the renames: the set is whole, now stop
        raise KeyboardInterrupt


def _copy_to_stream(tmp: Path, final: Path) -> None:
    """Write the bytes of `tmp` to stream `final`: this process's stdout for `-` and its
    names (/dev/stdout: opened anew it would truncate a redirected file under what the
    command prints), else `final` opened once for writing (a FIFO waits for its reader)."""
    with open(tmp, "rb") as src:
        if os.fspath(final) in _STDOUT_NAMES:
            sys.stdout.flush()
            out = getattr(sys.stdout, "buffer", None)
            if out is None:  # a text-only stdout (a caller's capture): the bytes as text
                sys.stdout.write(src.read().decode("utf-8", "replace"))
            else:
                shutil.copyfileobj(src, out)
            sys.stdout.flush()
            return
        try:
            with open(final, "wb") as dst:
                shutil.copyfileobj(src, dst)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise InputError(f"cannot write {final} ({err.strerror or err})") from None


def write_text_atomically(path, text: str) -> Path:
    """One text file, atomically."""
    return write_outputs_atomically([(Path(path), lambda tmp: tmp.write_text(text))])[0]
