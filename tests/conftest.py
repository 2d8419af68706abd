"""Shared fixtures: synthetic shard sets for the data, loader and training tests.

- `demo_dir`: the SMALL demo preset (12 species x 4 train + 2 eval, 8-12 s, all codecs and rates),
  generated once for the package's sources (kept between sessions: `DATA`): `demo_dir / "train"`,
  `demo_dir / "eval"`, `demo_dir / "manifest.json"`.
- `birdset_dir`: the BIRDSET_SMALL BirdSet stand-in (2 tasks, `SYN1`, `SYN2`, each with `train` and
  `test_5s`, `SYN2` with a test-only class), generated as `demo_dir` is.
- `tiny_shards` / `tiny_shards_stream`: 12 short pure tones (frequency known per label) in 3 shards of
  4 rows, record batches of 2 rows, every codec; Arrow file / stream format.
- `corrupt_shards`: the same 12 rows, where rows 2, 6 and 9 cannot be decoded (see `TinyShards.corrupt`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest

try:
    import birdjepa  # noqa: F401  (installed, e.g. by `maturin develop`)
except ImportError:  # running from a plain checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from birdjepa.cli import fewer_collections
from birdjepa.data.shards import ShardFormat, ShardWriter, write_vocab
from birdjepa.host_memory import keep_for_reuse
from birdjepa.synthetic.birdset_standin import BIRDSET_SMALL
from birdjepa.synthetic.codecs import CODECS, encode_audio
from birdjepa.synthetic.demo import SMALL, default_cache_dir, ensure_birdset_data, ensure_demo_data
from birdjepa.train import compile_cache  # noqa: F401  (entries written whole: workers share one cache)
from birdjepa.train.determinism import cpu_model, deterministic_xla

TEST_XLA_FLAG = "--xla_backend_optimization_level=0"
DEFAULT_LEVEL_ENV = "BIRDJEPA_TEST_XLA_DEFAULT"
"""Set to 1, the tests compile at XLA's default level, as users run (`.ci/run`: `pytest -m default_level`)."""
AT_DEFAULT_LEVEL = os.environ.get(DEFAULT_LEVEL_ENV) == "1"

# Before any test runs a JAX computation: thread-timing-independent XLA kernels, a fixed CPU thread
# pool, and LLVM at -O0. `make test` compiles far more than it runs (tiny models, a few steps each):
# -O0 cuts its CPU time by a fifth. -O0 also keeps XLA from handing reductions and matrix products to
# its kernel libraries, whose split follows the thread pool: what depends on arithmetic (exact resume,
# equal device counts, the trace, bisect's noise floor) is proved again at the default level by the
# tests marked default_level, which CI runs with BIRDJEPA_TEST_XLA_DEFAULT=1.
if not AT_DEFAULT_LEVEL:
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAG}".strip()
deterministic_xla()
fewer_collections()  # as the `birdjepa` command does: the workers train in-process too
keep_for_reuse()  # the same: before JAX's threads start (the step digests then hold its bits too)

REPO = Path(__file__).resolve().parents[1]

# A JAX compilation cache that outlives the session and the checkout, in the user's birdjepa cache
# (`$BIRDJEPA_CACHE/test-xla/`, default ~/.cache/birdjepa/test-xla/, beside the runs' own `xla/`): the tests
# train the same tiny models again and again, and XLA compiling their steps is ~150 s of the suite's wall
# time on two cores (fresh clones, 2026-11-29: 6:41 with the folder empty, 4:14 loading it); a fresh clone
# or a second worktree loads what any checkout on this machine compiled. A cached executable is the one XLA
# compiled (JAX keys it by the module, the XLA flags and jaxlib's version), so results stay bit-identical;
# the folder is per CPU model and CPU thread pool (JAX's key leaves the pool out, and XLA compiles its loop
# partitions for it), for a home shared by machines. Entries are written whole
# (`birdjepa.train.compile_cache`): sessions of several checkouts share it. A `make test` adds ~20 MB where
# code changed a step (`.ci/run` ~105 MB); past 1 GiB the first process starts the folder over (JAX's own
# size cap locks and stamps every entry it reads: a fresh run took 5:07 with it, 4:30 without).
MACHINE = f"{cpu_model()} threads={os.environ['PJRT_NPROC']}"
JAX_CACHE = default_cache_dir() / "test-xla" / hashlib.sha1(MACHINE.encode()).hexdigest()[:12]
if "PYTEST_XDIST_WORKER" not in os.environ and JAX_CACHE.is_dir():
    if sum(f.stat().st_size for f in JAX_CACHE.iterdir() if f.is_file()) > 1 << 30:
        shutil.rmtree(JAX_CACHE, ignore_errors=True)
os.environ.update(
    JAX_COMPILATION_CACHE_DIR=str(JAX_CACHE),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
)
# ... and in this process, whose JAX the imports above started before these were set: JAX reads them as it
# starts. The xdist workers start with them; `pytest -p no:xdist tests/FILE` compiled every step anew.
jax.config.update("jax_compilation_cache_dir", str(JAX_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

TINY_LABELS = ("aaalow", "bbbmid", "ccchig")
TINY_FREQS_HZ = (750.0, 1500.0, 3000.0)
TINY_RATES = (44100, 48000, 32000, 22050)


@dataclass(frozen=True)
class TinyRow:
    recording_id: str
    label: int
    freq_hz: float
    codec: str
    sample_rate: int
    channels: int
    seconds: float
    shard: str
    row: int
    """Row index inside the shard."""
    corrupt: bool


@dataclass(frozen=True)
class TinyShards:
    path: Path
    rows: tuple[TinyRow, ...]
    """In shard order: rows[i] is global row i."""

    @property
    def corrupt(self) -> list[TinyRow]:
        return [r for r in self.rows if r.corrupt]


def tone(freq_hz: float, sample_rate: int, seconds: float, channels: int = 1) -> np.ndarray:
    """A 0.5-amplitude sine with 10 ms fades, float32 (frames, channels)."""
    n = int(round(seconds * sample_rate))
    t = np.arange(n) / sample_rate
    x = 0.5 * np.sin(2 * np.pi * freq_hz * t) * np.minimum(1.0, np.minimum(t, t[::-1]) / 0.01)
    return np.repeat(x[:, None], channels, axis=1).astype(np.float32)


def write_tiny_shards(
    out: Path, fmt: ShardFormat = "file", corrupt_rows: dict[int, str] | None = None
) -> TinyShards:
    """12 rows of tones; `corrupt_rows` maps a global row to "garbage" (text, not audio), "truncated"
    (the first 30 bytes: a cut header) or "empty" (zero bytes)."""
    corrupt_rows = corrupt_rows or {}
    codecs = list(CODECS)
    rows = []
    with ShardWriter(out, "tiny", target_bytes=1 << 40, fmt=fmt, batch_rows=2, max_rows=4) as w:
        for i in range(12):
            label = i % 3
            codec = codecs[i % len(codecs)]
            sr = TINY_RATES[i % len(TINY_RATES)]
            channels = 2 if i % 5 == 4 else 1
            seconds = 2.0 + 0.25 * (i % 5)
            rid = f"tiny{i:03d}"
            data = encode_audio(tone(TINY_FREQS_HZ[label], sr, seconds, channels), sr, codec, ogg_serial=i)
            kind = corrupt_rows.get(i)
            if kind == "garbage":
                data = (b"not audio " * (len(data) // 10 + 1))[: len(data)]
            elif kind == "truncated":
                data = data[:30]
            elif kind == "empty":
                data = b""
            elif kind is not None:
                raise ValueError(f"unknown corruption {kind!r} for row {i}")
            w.add(data, f"{rid}.{CODECS[codec][2]}", label, rid)
            shard, row = f"tiny-{i // 4:05d}.arrow", i % 4
            freq = TINY_FREQS_HZ[label]
            rows.append(TinyRow(rid, label, freq, codec, sr, channels, seconds, shard, row, kind is not None))
    write_vocab(out, list(TINY_LABELS))
    return TinyShards(out, tuple(rows))


def rewrite_meta(meta_file: Path, meta: dict) -> None:
    """A checkpoint's meta as another machine or birdjepa wrote it: with its CRC-32 recomputed (an edit
    without it is damage, which these tests are not about)."""
    from birdjepa.rundir.checkpoint.integrity import meta_crc

    meta_file.write_text(json.dumps({**meta, "meta_crc": meta_crc(meta)}))


def a_demo_shard_beside_its_vocabulary(demo_dir: Path, folder: Path) -> Path:
    """Makes ``folder`` with the demo train split's vocab.json in it; returns the split's first shard, for
    the test to write (damaged) into ``folder``."""
    folder.mkdir(parents=True)
    (folder / "vocab.json").write_bytes((demo_dir / "train" / "vocab.json").read_bytes())
    return sorted((demo_dir / "train").glob("*.arrow"))[0]


def _sources_key() -> str:
    """A hash of the package's sources and the locked dependencies (the codecs among them): what the
    synthetic sets are made by."""
    h = hashlib.sha256()
    for path in sorted([*(REPO / "src").rglob("*.py"), *(REPO / "rust").rglob("*.rs"), REPO / "uv.lock"]):
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# The synthetic sets the tests read, kept between sessions in the user's birdjepa cache (beside the
# compile cache) under a hash of the sources that make them: generating the demo set held both workers
# ~3.5 s at the start of every session. Any change to the package (or the lock) makes them anew; the
# first process keeps the 4 newest and those another checkout used within a day.
DATA_CACHE = default_cache_dir() / "test-data"
DATA = DATA_CACHE / _sources_key()
if "PYTEST_XDIST_WORKER" not in os.environ:
    DATA.mkdir(parents=True, exist_ok=True)
    os.utime(DATA)
    kept = sorted(DATA_CACHE.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in kept[4:]:
        if time.time() - old.stat().st_mtime > 86400:
            shutil.rmtree(old, ignore_errors=True)


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    """The SMALL demo preset, generated by the first worker that asks where no session made it from these
    sources (read-only: do not modify it, it outlives the session)."""
    with open(DATA / "demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return ensure_demo_data(SMALL, DATA / "demo", verbose=False)


@pytest.fixture(scope="session")
def birdset_dir() -> Path:
    """The BIRDSET_SMALL stand-in, as `demo_dir` (read-only: do not modify it)."""
    with open(DATA / "birdset.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return ensure_birdset_data(BIRDSET_SMALL, DATA / "birdset", verbose=False)


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory: pytest.TempPathFactory) -> TinyShards:
    return write_tiny_shards(tmp_path_factory.mktemp("tiny") / "shards", "file")


@pytest.fixture(scope="session")
def tiny_shards_stream(tmp_path_factory: pytest.TempPathFactory) -> TinyShards:
    return write_tiny_shards(tmp_path_factory.mktemp("tiny_stream") / "shards", "stream")


@pytest.fixture(scope="session")
def corrupt_shards(tmp_path_factory: pytest.TempPathFactory) -> TinyShards:
    """Rows 2 (garbage), 6 (truncated) and 9 (empty) cannot be decoded."""
    return write_tiny_shards(
        tmp_path_factory.mktemp("corrupt") / "shards", "file", {2: "garbage", 6: "truncated", 9: "empty"}
    )


# The files with the longest trainings first, as `make test` measured them (warm, 2026-12-07): xdist
# hands out whole files in collection order (--dist loadfile --no-loadscope-reorder; its default order,
# by test count, left the one-test 35 s file for the end, with the other core idle), so the short ones
# fill in at the end instead of a long one running alone (test_validation, 23 s, was the last but one).
LONGEST_FIRST = (
    "test_train_resume.py",
    "test_evaluation.py",
    "test_fail_safe.py",
    "test_resume_checks.py",
    "test_validation.py",
    "test_divergence.py",
    "test_upgrade.py",
    "test_lease.py",
    "test_encoder_options.py",
    "test_objectives.py",
    "test_sweep.py",
    "test_full_disk.py",
    "test_torn_log.py",
    "test_perf.py",
    "test_scale_set.py",
    "test_checkpoint.py",
)


@pytest.fixture(autouse=True)
def _at_the_level_the_test_asserts(request: pytest.FixtureRequest) -> None:
    """A ``default_level`` test at the suite's -O0 would prove nothing about the level users run (and
    may fail where -O0 computes otherwise): it fails, saying how to run it."""
    if request.node.get_closest_marker("default_level") and not AT_DEFAULT_LEVEL:
        pytest.fail(f"asserts at XLA's default level: run it with {DEFAULT_LEVEL_ENV}=1 (as .ci/run does)")


# The slow set's (.ci/run: `-m "slow and not default_level"`, then `-m default_level`) longest files, as
# its cold run on a fresh clone measured them (2026-11-29; seconds of test time: the divergence matrix
# ~1,200, the GPU check 459, the device-count bits ~430, the wheel 315, Slurm ~300, the demo 294): left
# to xdist's order by test count, the one-test files ran last, the other core idle for ~4 minutes. The
# last two hold only short slow tests but the default-level stage's second and third longest (209 s and
# 152 s): there they start before its short files.
SLOW_LONGEST_FIRST = (
    "test_divergence.py",
    "test_gpu_check.py",
    "test_virtual_shards.py",
    "test_wheel.py",
    "test_slurm.py",
    "test_learning.py",
    "test_train_resume.py",
    "test_distributed.py",
    "test_evaluation.py",
    "test_objectives.py",
    "test_noise_floor.py",
)


@pytest.hookimpl(trylast=True)  # after -m deselected: ``items`` are what this run runs
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow = any(item.get_closest_marker("slow") for item in items)
    rank = {name: i for i, name in enumerate(SLOW_LONGEST_FIRST if slow else LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its order


def run_notebook(name: str, **defs: object) -> dict:
    """Runs ``notebooks/<name>.py`` headless with ``defs`` in place of the cells that define them; returns
    the notebook's globals."""
    import importlib.util

    path = REPO / "notebooks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"notebook_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, out = module.app.run(defs=defs)
    return dict(out)
