"""What every command shares: one line and exit status 2 for any failure, 130 for Ctrl-C
(143 for SIGTERM, 129 for SIGHUP), a closed output pipe that ends quietly in one line, and
argparse that reports usage errors as one line.

    def main(argv=None) -> int:
        return guarded("python -m sweeps.NAME", lambda: run(parse(argv)))
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from typing import Callable

from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver.devices import use_every_core

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130  # 130 = 128 + SIGINT
NUMBER_LIKE = re.compile(r"^-[0-9.]")  # an argument that is a (signed) value, never an option
INT32_MAX = 2**31 - 1  # int_arg's bound when none is given: every count reaches an int32 lane


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as an InputError (one line, no usage block), and
    hands an argument that starts with '-' and a digit or '.' to the option before it as its
    value (`--time-window -1,5`, `--shift -.5`): argparse's own rule takes only plain numbers
    (`-1`, `-1.5`) as values and "-1,5" for an unknown option, so the flag's own check never
    answered. No command has an option spelled like a number, so nothing is lost."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NUMBER_LIKE  # read by argparse's _parse_optional

    def error(self, message):
        raise InputError(message)


class CheckFailed(RuntimeError):
    """--check found a conservation law violated (an engine defect, never bad input): exit 1."""


def say_error(prog: str, message: str) -> None:
    """One line on stderr (newlines in the message are escaped)."""
    line = str(message).replace("\r", "\\r").replace("\n", "\\n")
    try:
        print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
    except (BrokenPipeError, OSError):
        pass


def _silence_stdout() -> None:
    """After a closed pipe: send further output (and the interpreter's final flush) nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _is_command() -> bool:
    """Whether this process is a command itself (python -m sweeps.X / vtc_jax / benchmarks.X),
    not a caller (a test) running one in-process."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name.split(".")[0] in ("sweeps", "vtc_jax", "benchmarks")


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
interrupted_line = fileio.interrupted_line  # "interrupted (Ctrl-C); no results were written"


def _stop_on_signals(prog: str) -> None:
    """In a command process, Ctrl-C, SIGTERM and SIGHUP stop it at once with one line and
    status 128 + signal (130, 143, 129).

    Python's default (a KeyboardInterrupt raised wherever the main thread is; SIGTERM and
    SIGHUP kill the process outright, leaving the writer's temporaries) fails under JAX:
    raised inside jax's garbage-collection callback a KeyboardInterrupt is printed as
    "Exception ignored" and lost, so the run goes on to the end; and tearing the
    interpreter down under XLA work still in flight crashes its runtime. So the handler
    records the signal (sticky: the writer and `guarded` look again, so a swallowed
    exception cannot lose it) and leaves at once, except while outputs are written: there
    it raises, so that the writer removes its temporaries before `guarded` reports it, and
    while a set is renamed into place it only records (the writer stops once the set is
    whole)."""
    if not _is_command():
        return

    def handler(signum, frame):
        fileio.record_interrupt(signum)
        if fileio.renaming():
            return
        if fileio.writing():
            raise KeyboardInterrupt
        say_error(prog, interrupted_line(signum, fileio.outputs_placed()))
        _exit_now(128 + signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)


def _interrupted(prog: str) -> int:
    """Report the recorded interrupt (Ctrl-C when none was recorded: a KeyboardInterrupt
    raised in-process) and return, or in a command process exit with, 128 + signal."""
    signum = fileio.pending_interrupt() or signal.SIGINT
    say_error(prog, interrupted_line(signum, fileio.outputs_placed()))
    if _is_command():  # no interpreter teardown under XLA work in flight
        _exit_now(128 + signum)
    return 128 + signum


def guarded(prog: str, body: Callable[[], int]) -> int:
    """Run a command's body; every failure becomes one line on stderr and an exit status:
    bad input 2, a failed --check 1, Ctrl-C 130 (SIGTERM 143, SIGHUP 129), a closed output
    pipe 2, out of memory 2. An interrupt recorded while the body ran is never lost: a
    body that returns after one (its exception swallowed somewhere) still exits with it."""
    _stop_on_signals(prog)
    if _is_command():  # a command owns its process: one XLA:CPU device per core
        use_every_core()
    try:
        status = body()
    except InputError as err:
        say_error(prog, str(err))
        return EXIT_BAD_INPUT
    except CheckFailed as err:
        say_error(prog, f"check failed: {err}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return _interrupted(prog)
    except BrokenPipeError:
        _silence_stdout()
        say_error(prog, "output pipe closed; stopped")
        return EXIT_BAD_INPUT
    except MemoryError:
        say_error(prog, "out of memory: make the run smaller (fewer seeds, lanes or steps; see --help for this "
                        "command's size flags)")
        return EXIT_BAD_INPUT
    except Exception as err:  # a defect, not bad input: still one line (VTC_JAX_TRACEBACK=1 shows it)
        if os.environ.get("VTC_JAX_TRACEBACK"):
            raise
        say_error(prog, f"internal error (a defect, please report it; VTC_JAX_TRACEBACK=1 shows where): "
                        f"{type(err).__name__}: {err}")
        return EXIT_FAILED
    if fileio.pending_interrupt():
        return _interrupted(prog)
    return status


def int_arg(minimum: int, maximum: int | None = None):
    """argparse type: an integer in [minimum, maximum] (plain decimal digits, a sign
    allowed); `maximum` None means INT32_MAX. Anything outside, however many digits it has,
    is reported as out of range with the range named (never "must be an integer")."""
    top = INT32_MAX if maximum is None else maximum

    def parse(text: str) -> int:
        text = text.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if not digits.isascii() or not digits.isdigit():
            raise argparse.ArgumentTypeError(f"must be an integer, got {text[:24]!r}")
        shown = text if len(text) <= 24 else f"{text[:12]}... ({len(digits)} digits)"
        if len(digits.lstrip("0")) > 40:  # past any range here; int() of 4,300+ digits raises
            raise argparse.ArgumentTypeError(f"out of range: must be {minimum} to {top}, got {shown}")
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} (range {minimum} to {top}), got {shown}")
        if value > top:
            raise argparse.ArgumentTypeError(f"out of range: must be {minimum} to {top}, got {shown}")
        return value
    return parse


def number_text(text: str) -> str:
    """argparse type: an exact number as typed (settings.to_fraction parses it); refuses
    texts whose exact value would take long to build: 64 characters and a 2-digit exponent
    always suffice for a usable cost or weight."""
    import re

    exponent = re.search(r"[eE][+-]?0*(\d*)$", text.strip())
    if len(text) > 64 or (exponent and len(exponent.group(1)) > 2):
        shown = text if len(text) <= 24 else text[:24] + "..."
        raise argparse.ArgumentTypeError(f"number too long or exponent out of range, got {shown!r}")
    return text


def list_arg(item, *, name: str = "values", min_items: int = 1, max_items: int = 4096):
    """argparse type: comma-separated items parsed by `item` (an argparse type)."""
    def parse(text: str):
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"{name} must be comma-separated, got {text[:40]!r}")
        if not min_items <= len(parts) <= max_items:
            raise argparse.ArgumentTypeError(f"{name}: {len(parts)} given, need {min_items} to {max_items}")
        return [item(p) for p in parts]
    return parse


def float_arg(minimum: float | None = None, maximum: float | None = None, *, open_min: bool = False):
    """argparse type: a finite float in range."""
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text[:24]!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text[:24]!r}")
        if minimum is not None and (value < minimum or (open_min and value == minimum)):
            raise argparse.ArgumentTypeError(f"must be {'>' if open_min else '>='} {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value
    return parse


def in_file(source, err: InputError) -> InputError:
    """`err` with the file it is about named in front (once): a row's problem found after
    reading (a prompt larger than M) names its line, and the line alone does not say where."""
    message = str(err)
    return InputError(message if message.startswith(str(source)) else f"{source}: {message}")
