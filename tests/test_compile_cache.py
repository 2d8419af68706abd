"""The persistent compilation cache (`birdjepa.train.compile_cache`): a requeued segment loads the step
the first segment compiled, and the run's bits are those of a run that compiled every step itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from birdjepa.resume.compare import compare_runs
from birdjepa.train import compile_cache

HIT = (
    "Persistent compilation cache hit for 'jit_run'"  # JAX's log line (JAX_LOG_COMPILES=1); jit_run: the step
)


def pretrain(runs: Path, run: str, cache: str, demo_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = compile_cache.without_jax_settings(os.environ)  # not the suite's cache: the command's own
    env.update(BIRDJEPA_COMPILE_CACHE=cache, JAX_LOG_COMPILES="1")
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", run, "--log.runs-dir", str(runs),
           "--steps", "4", "--eval-every", "0", "--ckpt-every", "2", "--data.batch-size", "8",
           "--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval"),
           *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow  # three processes, two of them compiling without any cache: ~70 s at -O0
@pytest.mark.default_level  # the bits users get: CI runs it with BIRDJEPA_TEST_XLA_DEFAULT=1
def test_a_run_is_bit_identical_with_the_cache_cold_warm_and_off(tmp_path: Path, demo_dir: Path) -> None:
    cache = tmp_path / "cache"
    cold = pretrain(tmp_path, "resumed", str(cache), demo_dir, "--stop-at-step", "1")
    assert HIT not in cold.stderr and any(cache.glob(f"{compile_cache.machine_key()}/jit_run-*")), (
        "the first segment compiles, and keeps it"
    )
    warm = pretrain(tmp_path, "resumed", str(cache), demo_dir)
    assert HIT in warm.stderr, "the requeued segment loads the step instead of compiling it"
    built = compile_cache.compiled_not_loaded(warm.stderr)  # ... nor any other program it runs
    assert built == 0, f"the requeued segment compiled {built} programs"
    off = pretrain(tmp_path, "straight", "off", demo_dir)
    assert "Persistent compilation cache" not in off.stderr
    differences = [(d.name, d.max_abs) for d in compare_runs(tmp_path / "straight", tmp_path / "resumed")]
    assert differences and all(m == 0.0 for _, m in differences), differences


def test_the_step_compiled_ahead_is_the_one_the_first_step_runs(demo_dir: Path) -> None:
    """The loop opens its segment with ``compile_ahead``: the step is traced, lowered and compiled (or
    loaded) in a thread while the checkpoint restores, and the first step runs that executable: the
    calling thread traces, lowers and compiles nothing. (A thread building a program of other shapes or
    shardings than the loop's call would leave the call to build its own.)"""
    import threading

    import jax
    import tyro

    from birdjepa.config import PretrainConfig
    from birdjepa.data import open_train_loader
    from birdjepa.train.segment import open_segment, step_inputs

    # Options no other test of this process compiles: a step that has run once is not compiled ahead.
    args = ["--data.batch-size", "6", "--data.train", str(demo_dir / "train"), "--data.eval",
            str(demo_dir / "eval"), "--objective.lejepa.num-directions", "40"]  # fmt: skip
    cfg = tyro.cli(PretrainConfig, args=args)
    seg = open_segment(cfg, None, at=None, compile_ahead=True)
    step, fns = seg.fns.train_step, seg.fns
    assert not step.called
    loader, _ = open_train_loader(
        seg.files[0], cfg.data, seed=cfg.seed, augment=True, state=None, resumed=False
    )
    with loader:
        batch = next(loader)
    state = fns.place(seg.state)
    x = step_inputs(fns, cfg, state, batch)
    built: list[str] = []
    caller = threading.current_thread()

    def listener(event: str, _secs: float, **_: object) -> None:
        if event.startswith("/jax/core/compile/") and threading.current_thread() is caller:
            built.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        *_, guard = step(state.params, state.opt_state, x.batch, x.key, x.check)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert bool(guard["finite"]) and built == [], built


WRITER = """
import sys
from jax._src import lru_cache
import birdjepa.train.compile_cache  # noqa: F401  (what every birdjepa process that compiles imports)
lru_cache.LRUCache(sys.argv[1], max_size=-1).put("step", bytes(1 << 28))
"""


def test_a_writer_killed_while_it_writes_an_entry_leaves_no_entry(tmp_path: Path) -> None:
    """A process killed while it writes a cache entry (here 256 MiB, killed once its bytes are landing)
    leaves nothing a later start reads: JAX wrote entries in place, and the cut-short one made every
    later start warn and compile again."""
    import signal
    import time

    from jax._src import lru_cache

    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        while not any(f.stat().st_size > 0 for f in tmp_path.iterdir() if f.is_file()):
            assert writer.poll() is None and time.monotonic() < deadline, "the writer ended before writing"
            time.sleep(0.001)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.wait()
    assert writer.returncode == -signal.SIGKILL, "the write finished before the kill: nothing was tested"
    assert lru_cache.LRUCache(str(tmp_path), max_size=-1).get("step") is None
    assert not (tmp_path / "step-cache").exists()
    # A whole entry has the mode JAX's own write gave it (the umask's), readable from a shared folder.
    lru_cache.LRUCache(str(tmp_path), max_size=-1).put("whole", b"entry")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "whole-cache").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_cache_folder_given_keeps_a_folder_per_kind_of_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # BIRDJEPA_COMPILE_CACHE=<folder> held the entries itself: on a shared file system another kind of
    # machine or JAX loaded them, where the default folder keys them.
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    assert compile_cache.cache_dir() == tmp_path / compile_cache.machine_key()
    monkeypatch.setenv(compile_cache.ENV, "off")
    assert compile_cache.cache_dir() is None
    # JAX's key holds the folder as given: a relative path or a link to it missed every entry (15 of 16
    # programs compiled again at a resume, a copy of each kept), a "~" made a folder named "~".
    (tmp_path / "link").symlink_to(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for given in (".", str(tmp_path / "link"), "~", "~/link/"):
        monkeypatch.setenv(compile_cache.ENV, given)
        assert compile_cache.cache_dir() == tmp_path / compile_cache.machine_key(), given
    monkeypatch.delenv(compile_cache.ENV)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)  # the suite's own cache
    monkeypatch.setenv("BIRDJEPA_CACHE", "link")
    assert compile_cache.cache_dir() == tmp_path / "xla" / compile_cache.machine_key()


def test_no_home_for_the_cache_is_one_line_and_no_compilation_cache(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # HOME unset and the user in no passwd (a container's UID): Path.home()'s RuntimeError, exit 1.
    from birdjepa.data import DataError
    from birdjepa.synthetic.demo import default_cache_dir

    for name in ("BIRDJEPA_CACHE", "XDG_CACHE_HOME", compile_cache.ENV, "JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    with pytest.raises(DataError, match=r"^no home folder for birdjepa's cache \(HOME unset, .*_CACHE$"):
        default_cache_dir()
    assert compile_cache.cache_dir() is None
    assert "WARNING no compilation cache (no home folder" in capsys.readouterr().out


def test_a_cache_that_cannot_be_made_written_or_read_whole_is_said_once_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A folder that cannot be made (a read-only home, a file in its place) was a traceback, exit 1; one
    # that cannot be written warned in two lines per program; an entry cut short (written in place by an
    # older version) was never replaced, and every start compiled again; "OFF" made a folder named OFF.
    import tempfile

    from jax._src import compilation_cache as jax_cache_format
    from jax._src import lru_cache

    for off in ("off", "OFF", " Off ", "0", "false", "no", "none", "Disabled"):
        monkeypatch.setenv(compile_cache.ENV, off)
        assert compile_cache.cache_dir() is None, off
    (tmp_path / "a-file").write_text("")
    for _ in range(2):
        assert not compile_cache._made(tmp_path / "a-file" / "xla")
    said = capsys.readouterr().out
    assert said.count(f"WARNING the compilation cache {tmp_path / 'a-file' / 'xla'} cannot be made") == 1
    whole = jax_cache_format.compress_executable(b"executable")
    cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)
    (tmp_path / "cut-cache").write_bytes(whole[:5])
    cache.put("cut", whole)
    assert (tmp_path / "cut-cache").read_bytes() == whole  # replaced
    cache.put("cut", jax_cache_format.compress_executable(b"another"))
    assert (tmp_path / "cut-cache").read_bytes() == whole  # a whole one stays: the first writer's
    # One that decompresses but did not load (read here, then put: JAX compiled it again) was never
    # replaced: every later segment warned "Failed to parse SerializedXlaExecutableMetadata" and compiled.
    assert cache.get("cut") == whole
    cache.put("cut", jax_cache_format.compress_executable(b"another"))
    assert (tmp_path / "cut-cache").read_bytes() == jax_cache_format.compress_executable(b"another")

    def denied(**_: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    for key in ("a", "b"):
        cache.put(key, whole)
    said = capsys.readouterr().out
    assert said.count(f"WARNING the compilation cache {tmp_path} takes no new entry") == 1, said
    # A full disk fails the write itself (JAX's two-line warning a program, 8 a run), said once.
    monkeypatch.undo()
    full = tmp_path / "full"
    full.mkdir()
    cache = lru_cache.LRUCache(str(full), max_size=-1)
    real_fdopen = os.fdopen

    def fills(fd: int, *args: object, **kw: object) -> object:
        handle = real_fdopen(fd, *args, **kw)

        def write(_: bytes) -> int:
            raise OSError(28, "No space left on device")

        handle.write = write
        return handle

    monkeypatch.setattr(os, "fdopen", fills)
    for key in ("c", "d"):
        cache.put(key, whole)
    said = capsys.readouterr().out
    assert said.count(f"WARNING the compilation cache {full} takes no new entry (No space left") == 1
    assert not list(full.iterdir()), list(full.iterdir())  # no entry, no leftover
