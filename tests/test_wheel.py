"""The wheel for machines without Rust (`make wheel`): installed into a fresh virtual environment whose
PATH holds no cargo and no rustc, with docs/install.md's two commands, it answers --help, reads the demo
shards through its Rust loader and trains two steps."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from birdjepa.rundir.metrics_log import metrics_by_step
from birdjepa.synthetic.demo import default_cache_dir

REPO = Path(__file__).resolve().parents[1]


def make_wheel(dist: Path) -> subprocess.CompletedProcess:
    """`make wheel` into ``dist``, its compiled dependencies kept for the next checkout on this machine.

    The zig build shares nothing with `make build`'s (another linker): in a fresh clone the test
    compiled ~200 crates again, 197 s alone where 89 s with them kept (2026-11-30). So the build tools
    (the Makefile's pinned maturin, uv and zig) get a venv in the user's birdjepa cache, keyed by their
    pins and this Python: cargo keys every crate by its linker's path, the zig wrapper of that venv's
    maturin. The target folder beside it keeps the dependencies. This checkout's own two crates are
    always compiled anew, under a lock: cargo calls a path crate fresh by its files' times, and another
    checkout's files at the same relative paths would pass."""
    pins = re.findall(r"^\w+_VERSION := .*$", (REPO / "Makefile").read_text(), re.MULTILINE)
    key = hashlib.sha1("\n".join([*pins, sys.version]).encode()).hexdigest()[:12]
    cache = default_cache_dir() / "test-wheel" / key
    cache.mkdir(parents=True, exist_ok=True)
    target, venv = cache / "target", cache / "venv"
    if target.is_dir() and sum(f.stat().st_size for f in target.rglob("*") if f.is_file()) > 2 << 30:
        shutil.rmtree(target)  # old dependencies' builds, after lock upgrades
    env = os.environ | {"CARGO_TARGET_DIR": str(target)}
    prune_other_keys(cache)
    with open(cache / "lock", "w") as lock:  # opening for writing dates it: this key's last use
        fcntl.flock(lock, fcntl.LOCK_EX)
        rustc = subprocess.check_output(["rustc", "-vV"], text=True)
        host = re.search(r"^host: (\S+)$", rustc, re.MULTILINE)[1]  # maturin --zig builds for it
        clean = ["cargo", "clean", "--quiet", "--release", "--target", host, "-p", "birdjepa-core",
                 "-p", "birdjepa-py"]  # fmt: skip
        subprocess.run(clean, cwd=REPO, env=env, check=True)
        return subprocess.run(["make", "wheel", f"VENV={venv}", f"WHEEL_DIR={dist}"], cwd=REPO, env=env,
                              capture_output=True, text=True)  # fmt: skip


STALE_DAYS = 14


def prune_other_keys(keep: Path) -> None:
    """Removes the other keys' folders unused for ``STALE_DAYS`` (~800 MB each: a pin bump leaves the
    old one behind), each only if no other session holds its lock."""
    for other in keep.parent.iterdir():
        lock_path = other / "lock"
        if other == keep or not lock_path.is_file():
            continue
        with open(lock_path, "a") as lock:  # appending leaves its date as it was
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use
            # Its date read under the lock: a build that opened (dated) it before then is not missed.
            if time.time() - lock_path.stat().st_mtime >= STALE_DAYS * 86400:
                shutil.rmtree(other, ignore_errors=True)


@pytest.mark.slow  # a release build linked through zig, and a venv installed from PyPI: minutes
def test_the_wheel_trains_where_no_rust_toolchain_exists(demo_dir: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    made = make_wheel(dist)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    (wheel,) = dist.glob("birdjepa-*.whl")
    assert "-cp310-abi3-manylinux" in wheel.name and "2_17" in wheel.name, wheel.name
    venv = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # The node's PATH: the venv and the system's basic tools, none of which is a Rust toolchain.
    path = os.pathsep.join([str(venv / "bin"), "/usr/bin", "/bin"])
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    env = {"PATH": path, "HOME": str(tmp_path), "BIRDJEPA_CACHE": os.environ.get("BIRDJEPA_CACHE", "")}
    env = {k: v for k, v in env.items() if v} | {"PIP_CACHE_DIR": str(Path.home() / ".cache" / "pip")}

    def run(*cmd: str) -> subprocess.CompletedProcess:
        done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{cmd}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    run("pip", "install", "-q", "-r", str(dist / "requirements.txt"), str(wheel))  # docs/install.md's command
    assert "pretrain" in run("birdjepa", "--help").stdout
    loaded = run("birdjepa", "loader-demo", "--data", str(demo_dir / "train"), "--batches", "3")
    assert "recordings in" in loaded.stdout
    data = ["--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval")]
    run("birdjepa", "pretrain", "--run", "w", "--log.runs-dir", str(tmp_path / "runs"),
                  "--steps", "2", "--data.batch-size", "4", "--eval-every", "0", *data)  # fmt: skip
    assert sorted(metrics_by_step(tmp_path / "runs" / "w")) == [0, 1]


def test_a_pin_bump_s_old_build_folder_goes_once_stale_and_unlocked(tmp_path: Path) -> None:
    keep, stale, recent, held = (tmp_path / name for name in ("keep", "stale", "recent", "held"))
    for folder in (keep, stale, recent, held):
        (folder / "target").mkdir(parents=True)
        (folder / "lock").touch()
    old = time.time() - (STALE_DAYS + 1) * 86400
    for folder in (keep, stale, held):
        os.utime(folder / "lock", (old, old))
    with open(held / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session building with it
        prune_other_keys(keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held", "keep", "recent"]
    assert os.stat(held / "lock").st_mtime == old  # looked at, not dated
