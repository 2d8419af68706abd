"""The `birdjepa` command keeps freed host memory for reuse (`birdjepa.host_memory`): a block as large
as a step's working memory, freed and taken again by a thread, faults no page the second time. The
step's bits under it are the step-digest test's (this suite runs with it, as the command does)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys

import pytest

from birdjepa import host_memory
from birdjepa.host_memory import ENV

# The command's entry point applies it, then prints its help; then a thread takes, touches and frees
# 256 MiB three times and prints the minor faults of the third time.
COMMAND = """
import sys
from birdjepa.cli import main
sys.argv = ["birdjepa", "--help"]
try:
    main()
except SystemExit:
    pass
"""
SCRIPT = """
import ctypes, resource, threading
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
size, faults = 256 << 20, []
def run():
    for _ in range(3):
        before = resource.getrusage(1).ru_minflt  # RUSAGE_THREAD
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        faults.append(resource.getrusage(1).ru_minflt - before)
        libc.free(ctypes.c_void_p(p))
t = threading.Thread(target=run)
t.start()
t.join()
print("FAULTS", faults[-1])
"""


def third_time_faults(env: dict[str, str], command: bool = True) -> int:
    """The faults of the third time, in a process that runs the command first (``command``) or not."""
    cmd = [sys.executable, "-c", (COMMAND if command else "") + SCRIPT]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split("FAULTS")[-1])


# glibc's mallopt: Linux only; never skipped under CI, where the users' platform must hold it.
NOT_GLIBC = sys.platform != "linux" and not os.environ.get("CI")


@pytest.mark.skipif(NOT_GLIBC, reason="glibc's mallopt: Linux only")
def test_the_command_reuses_a_freed_large_block_without_faulting_it_in_again() -> None:
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "JAX_PLATFORMS")}
    assert third_time_faults(env) < 100  # 65,536 pages of 4 KiB (glibc's default faults > 60,000: below)


def test_system_or_an_accelerator_leaves_the_c_library_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # A step on an accelerator gains nothing, and its compiles would wait on one arena: left as it is.
    # (The command's default, in a process of its own: the test above.)
    called: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            called.append((param, value))
            return 1

    monkeypatch.setattr(host_memory.ctypes, "CDLL", lambda *_: Libc())
    monkeypatch.setenv(ENV, "system")
    assert host_memory.keep_for_reuse() is False
    monkeypatch.delenv(ENV)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert host_memory.keep_for_reuse() is False
    assert called == []  # no setting changed, whatever it returned
    if platform.libc_ver()[0] == "glibc":  # the recorder sees the default's settings
        monkeypatch.delenv("JAX_PLATFORMS")
        assert host_memory.keep_for_reuse() is True and len(called) == len(host_memory.SETTINGS)


def test_a_value_other_than_reuse_or_system_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # "System" kept the default, "reuse", without a word.
    monkeypatch.setenv(ENV, "System")
    with pytest.raises(ValueError, match=f"^{ENV}='System': give 'reuse' \\(the default\\) or 'system'$"):
        host_memory.keep_for_reuse()
    done = subprocess.run([sys.executable, "-m", "birdjepa.cli", "--help"], capture_output=True, text=True,
                          env={**os.environ, ENV: "off"}, timeout=120)  # fmt: skip
    assert (done.returncode, done.stderr) == (2, f"birdjepa: error: {ENV}='off': give 'reuse' (the default) "
                                                 "or 'system'\n"), done.stderr  # fmt: skip


def test_an_accelerator_plugin_means_the_step_is_not_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert host_memory.steps_on_cpu()  # this machine: no plugin
    plugin = importlib.metadata.EntryPoint("xla_cuda12", "jax_cuda12_plugin", "jax_plugins")
    monkeypatch.setattr(host_memory.importlib.metadata, "entry_points", lambda group: [plugin])
    assert not host_memory.steps_on_cpu()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # asked for: the CPU, plugin or not
    assert host_memory.steps_on_cpu()


@pytest.mark.skipif(NOT_GLIBC, reason="glibc's tunables: Linux only")
def test_the_tunables_keep_a_process_that_is_not_ours_from_faulting_again() -> None:
    """`host_memory.TUNABLES`: what `scripts/bench_reference.py --host-memory reuse` gives both sides."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    assert third_time_faults(env, command=False) > 60_000
    assert third_time_faults({**env, "GLIBC_TUNABLES": host_memory.TUNABLES}, command=False) < 100
