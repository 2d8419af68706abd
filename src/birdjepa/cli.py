"""The `birdjepa` command: subcommands dispatched from a small table.

Add a subcommand by adding an entry to `COMMANDS` (or calling `register` before `main`): the value is
a function, or a `"module:function"` string imported only when that subcommand runs (so `birdjepa
demo-data` does not import JAX). tyro builds each subcommand's flags from the function's signature and
its help text from the docstring; `birdjepa --help` imports them all to list them. A function with a
``parse`` attribute (``pretrain``: its defaults come from the run's checkpoint) gets what that builds from
the subcommand's arguments instead.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import tyro

import birdjepa.verify  # noqa: F401 (registers the plants and faults the --debug options name)
from birdjepa.exit_codes import INTERRUPTED, IOERR, PIPE_CLOSED, TERMINATED, USAGE, exit_now
from birdjepa.host_memory import keep_for_reuse
from birdjepa.slurm.distributed import launched_tasks
from birdjepa.train.determinism import deterministic_xla, overridden_flags

CommandTarget = str | Callable[..., Any]

COMMANDS: dict[str, CommandTarget] = {
    "demo-data": "birdjepa.synthetic.demo_data:cli",
    "prepare": "birdjepa.data.prepare:cli",
    "loader-demo": "birdjepa.synthetic.loader_demo:cli",
    "pretrain": "birdjepa.pretrain.loop:cli",
    "verify-resume": "birdjepa.resume.verify:cli",
    "compare": "birdjepa.resume.compare:cli",
    "sweep": "birdjepa.sweep:cli",
    "analyze": "birdjepa.analysis.report:cli",
    "evaluate": "birdjepa.evaluation.cli:cli",
    "benchmark": "birdjepa.benchmark.cli:cli",
    "export": "birdjepa.export.cli:export_cli",
    "embed": "birdjepa.export.cli:embed_cli",
    "trace": "birdjepa.divergence.cli:trace",
    "diff-trace": "birdjepa.divergence.cli:diff_trace",
    "bisect": "birdjepa.divergence.cli:bisect",
}


#: The commands whose numbers XLA computes (a step, an encoder): warned of determinism flags overridden.
COMPUTES = frozenset(
    {"pretrain", "verify-resume", "evaluate", "benchmark", "export", "embed", "trace", "bisect"}
)


def register(name: str, target: CommandTarget) -> None:
    """Adds (or replaces) subcommand `name`."""
    if not name or name.startswith("-") or " " in name:
        raise ValueError(f"bad subcommand name {name!r}")
    COMMANDS[name] = target


def resolve(target: CommandTarget) -> Callable[..., Any]:
    """The function a table entry names."""
    if callable(target):
        return target
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"subcommand target {target!r} must be 'module:function'")
    return getattr(importlib.import_module(module), attr)


def _unavailable(name: str, error: Exception) -> Callable[[], None]:
    def unavailable() -> None:
        raise SystemExit(f"birdjepa {name}: unavailable: {error}")

    unavailable.__doc__ = f"(unavailable: {type(error).__name__}: {error})"
    return unavailable


#: CPython collects its youngest generation every 700 net allocations (its default). Importing JAX and
#: tracing a step allocate millions of short-lived objects, so a launch ran ~350 collections: at 100000
#: a 6-step demo pretrain launch takes 9% less wall time (`scripts/bench_startup.py`). Cyclic garbage
#: waits a little longer (at most ~100000 objects) and is still collected.
GC_YOUNG_THRESHOLD = 100_000


def fewer_collections() -> None:
    """Collect the youngest generation every `GC_YOUNG_THRESHOLD` allocations (the older ones as before)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


STDOUT = "standard output"


class NamedStdout:
    """``sys.stdout`` whose failed writes name it (`STDOUT`); a closed pipe's stays a BrokenPipeError."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with _named():
            return self._stream.write(text)

    def flush(self) -> None:
        with _named():
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def _named() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OSError(e.errno, e.strerror, STDOUT) from e


def _quiet_stdout() -> None:
    """Standard output to /dev/null: what is still buffered for it fails no more at exit's flush."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class Terminated(BaseException):
    """A SIGTERM (`kill PID`, `scancel`) to a command that does not save: raised where it runs, so that
    what it holds is let go (evaluate's lease of the run) and it ends in one line. It died without a
    word, its lease left to go stale (60 s on another host)."""


def _terminated(_sig: int, _frame: Any) -> None:
    raise Terminated


def out_now(argv: Sequence[str] | None, code: int) -> NoReturn:
    """Exit ``code`` after a Ctrl-C: at once in a process of its own (``argv`` None) and alone (not one of
    a group, whose shutdown the others wait for), past the interpreter's teardown. There, jaxlib's
    module freed with the interrupted traceback's frames segfaulted (exit -11 after "exit 130", in
    evaluate and benchmark), and a compile still running on a thread aborted (exit -6)."""
    if argv is None and launched_tasks() <= 1:
        exit_now(code)
    raise SystemExit(code) from None


def main(argv: Sequence[str] | None = None) -> Any:
    """Entry point of the `birdjepa` console script (``argv`` None: the command line's)."""
    fewer_collections()
    if argv is None:  # a process of its own, before JAX's threads start (not a caller's, e.g. a test's)
        try:
            keep_for_reuse()
        except ValueError as e:
            print(f"birdjepa: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(USAGE) from None
    # Before anything can start JAX's backend (reading a run's checkpoint does): XLA reads its flags
    # and sizes its CPU thread pool once, when the backend starts.
    deterministic_xla()
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMPUTES and (overridden := overridden_flags()):
        print(f"WARNING XLA_FLAGS sets {' '.join(overridden)}: the step's last bits may then depend on "
              "thread timing, and a resume may not be exact (birdjepa sets the other value)",
              file=sys.stderr, flush=True)  # fmt: skip
    if sys.stdout is None:  # closed by the caller (`>&-`): a command's work done, then a traceback, exit 1
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    if argv is None:  # a failed write says it was the console's (a traceback, exit 1: compare's "differ")
        sys.stdout = NamedStdout(sys.stdout)
    before = signal.getsignal(signal.SIGTERM)
    if argv is None:  # pretrain, sweep and verify-resume set their own while they run
        signal.signal(signal.SIGTERM, _terminated)
    name = f" {args[0]}" if args and args[0] in COMMANDS else ""
    try:  # every relative path is read from it: os.path.abspath's traceback, exit 1
        os.getcwd()
    except FileNotFoundError:
        print(f"birdjepa{name}: error: the working folder was removed after this shell entered it: cd to one "
              "that exists", file=sys.stderr, flush=True)  # fmt: skip
        raise SystemExit(USAGE) from None
    try:
        result = _run(args)
        sys.stdout.flush()  # here, not at exit: a pipe closed early fails in this try, not after it
        return result
    except KeyboardInterrupt:  # a 40-line traceback for a stop asked for (the commands that save say more)
        print(f"birdjepa{name}: interrupted; exit {INTERRUPTED}", file=sys.stderr, flush=True)
        out_now(argv, INTERRUPTED)
    except Terminated:
        print(f"birdjepa{name}: terminated (SIGTERM); exit {TERMINATED}", file=sys.stderr, flush=True)
        out_now(argv, TERMINATED)
    except SystemExit as e:  # pretrain's own Ctrl-C exits
        if e.code == INTERRUPTED:
            out_now(argv, INTERRUPTED)
        raise
    except BrokenPipeError:  # `| head` closed the pipe: a traceback, then another at exit's flush
        _quiet_stdout()
        raise SystemExit(PIPE_CLOSED) from None
    except AssertionError:  # JAX's bare one where $JAX_PLATFORMS names a backend this machine lacks
        platforms = os.environ.get("JAX_PLATFORMS", "")
        if not platforms or not _no_backend():
            raise
        print(f"birdjepa{name}: error: $JAX_PLATFORMS={platforms!r}: no such backend on this machine (a "
              "job on another partition's nodes?); unset it or name one it has", file=sys.stderr,
              flush=True)  # fmt: skip
        raise SystemExit(USAGE) from None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:  # a name past the file system's 255 bytes: each command's traceback
            print(f"birdjepa{name}: error: {e.filename}: {e.strerror}", file=sys.stderr, flush=True)
            raise SystemExit(USAGE) from None
        if e.filename == STDOUT:  # `> file` on a full disk or quota: the command's output is lost
            _quiet_stdout()
            print(f"birdjepa{name}: error: the {STDOUT} cannot be written ({e.strerror}); exit {IOERR}",
                  file=sys.stderr, flush=True)  # fmt: skip
            raise SystemExit(IOERR) from None
        # Another user's run made under umask 077: a traceback, exit 1 (compare's "the runs differ"). The
        # commands' own writes say more where they fail (exit 74 too).
        if e.errno in (errno.EACCES, errno.EPERM) and e.filename is not None:
            print(f"birdjepa{name}: error: {e.filename}: {e.strerror}; exit {IOERR}", file=sys.stderr,
                  flush=True)  # fmt: skip
            raise SystemExit(IOERR) from None
        raise
    finally:  # its work done: a SIGTERM at the interpreter's exit raised Terminated in JAX's atexit hook
        if argv is None:
            signal.signal(signal.SIGTERM, before)


def _no_backend() -> bool:
    """Whether JAX could start no backend (its private state: a requeue onto a CPU node under
    JAX_PLATFORMS=cuda was `assert _default_backend is not None`, a bare AssertionError)."""
    try:
        from jax._src import xla_bridge

        return xla_bridge._default_backend is None
    except (ImportError, AttributeError):  # another JAX: its own error stands
        return False


def _run(args: list[str]) -> Any:
    if args and args[0] in COMMANDS:  # import only the subcommand asked for
        function = resolve(COMMANDS[args[0]])
        own_parser = getattr(function, "parse", None)  # a command whose defaults depend on its flags
        if own_parser is not None:
            return function(own_parser(args[1:]))
        functions = {args[0]: function}
    else:  # --help, no or unknown subcommand: list them all, even those that fail to import
        functions = {}
        for name, target in COMMANDS.items():
            try:
                functions[name] = resolve(target)
            except ImportError as e:
                functions[name] = _unavailable(name, e)
    return tyro.extras.subcommand_cli_from_dict(
        functions,
        prog="birdjepa",
        description="birdjepa: exactly resumable self-supervised pretraining for bird-song encoders.",
        args=args,
    )


if __name__ == "__main__":
    main()
