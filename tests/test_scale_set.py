"""The scale set and the loader at its scale, scaled down (2,000 recordings of 1-2 s in 50 shards):
coverage of an epoch, exact restores with a buffer that holds the whole epoch, the planner's stream is
the loader's, and the loader's memory does not grow with the shards it reads."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from birdjepa.cli import main as cli_main
from birdjepa.data import Loader, plan_indices, take
from birdjepa.data.shards import list_shards, read_shard
from birdjepa.synthetic.codecs import CODECS
from birdjepa.synthetic.scale_set import SCALE_CODEC_MIX, ScaleConfig, generate_scale_set, shard_rows

SMALL_SCALE = ScaleConfig(
    recordings=2000, shards=50, pool=32, eval_recordings=8, min_seconds=1.0, max_seconds=2.0
)


@pytest.fixture(scope="module")
def scale_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_scale_set(tmp_path_factory.mktemp("scale") / "set", SMALL_SCALE, workers=2)


def test_the_set_has_its_rows_shards_codecs_and_the_pools_bytes(scale_dir: Path) -> None:
    manifest = json.loads((scale_dir / "manifest.json").read_text())
    shards = list_shards(scale_dir / "train")
    rows = [s["rows"] for s in manifest["splits"]["train"]["shards"]]
    assert len(shards) == 50 and sum(rows) == 2000 and rows == shard_rows(SMALL_SCALE)
    assert min(rows) < 0.8 * max(rows)  # unequal shard sizes, as in real sets
    assert set(manifest["splits"]["train"]["codecs"]) == set(SCALE_CODEC_MIX)
    pool = {r["id"]: r for r in manifest["recordings"] if r["split"] == "train"}
    pool_ids = sorted(pool)
    index = manifest["train_pool_index"]
    assert set(np.bincount(index, minlength=32).tolist()) == {62, 63}  # 2000 rows over 32 entries
    # Every row carries its pool entry's bytes under its own id and the entry's species.
    digest_of_entry: dict[int, str] = {}
    r = 0
    for shard in shards:
        table = read_shard(shard)
        columns = [table.column(c).to_pylist() for c in ("audio", "ebird_code", "recording_id")]
        for audio, label, rid in zip(*columns, strict=True):
            entry = index[r]
            digest = hashlib.sha256(audio["bytes"]).hexdigest()
            assert digest_of_entry.setdefault(entry, digest) == digest
            source = pool[pool_ids[entry]]
            assert rid == f"XS{r:07d}" and audio["path"].endswith("." + CODECS[source["codec"]][2])
            assert manifest["species"][label]["code"] == source["species"]
            r += 1
    assert r == 2000 and len(set(digest_of_entry.values())) == 32


def test_the_cli_and_the_function_write_the_same_bytes_with_1_and_2_workers(tmp_path: Path) -> None:
    # No --pool: its default (2048) is capped at --recordings (a set of fewer recordings was refused).
    args = ["--recordings", "4", "--shards", "2", "--n-species", "4", "--per-species-eval", "1"]
    cli_main(["demo-data", str(tmp_path / "cli"), *args, "--workers", "1"])
    config = ScaleConfig(recordings=4, shards=2, pool=4, n_species=4, eval_recordings=4)
    generate_scale_set(tmp_path / "function", config, workers=2)
    for split in ("train", "eval"):
        one = [p.read_bytes() for p in list_shards(tmp_path / "cli" / split)]
        assert one and one == [p.read_bytes() for p in list_shards(tmp_path / "function" / split)]
    assert (tmp_path / "cli/manifest.json").read_bytes() == (tmp_path / "function/manifest.json").read_bytes()


def test_an_epoch_through_the_loader_gives_every_index_once_in_the_planners_order(scale_dir: Path) -> None:
    # A small buffer: the last epoch-0 samples leave it soon after the epoch is read (a whole-epoch
    # buffer would keep some for ~N ln N draws, a coupon collector).
    loader = Loader(scale_dir / "train", seed=5, batch_size=64, n_workers=2, shuffle_buffer=64)
    sizes = loader.shard_sizes
    index, epoch = np.empty(0, np.int64), np.empty(0, np.int64)
    while (epoch == 0).sum() < 2000:  # the buffer gives epoch-0 samples out among epoch-1 ones
        b = next(loader)
        index, epoch = np.concatenate([index, b["index"]]), np.concatenate([epoch, b["epoch"]])
    assert np.array_equal(np.sort(index[epoch == 0]), np.arange(2000))
    planned, planned_epoch = plan_indices(sizes, len(index), seed=5, batch_size=64, shuffle_buffer=64)
    assert np.array_equal(planned, index) and np.array_equal(planned_epoch, epoch)


def test_restores_with_a_whole_epoch_buffer_continue_the_straight_stream(scale_dir: Path) -> None:
    opts = {"seed": 2, "batch_size": 32, "n_workers": 2, "shuffle_buffer": 100_000}  # capped at one epoch
    loader = Loader(scale_dir / "train", **opts)
    straight, states = [], []
    for _ in range(10):
        states.append(loader.state())
        straight.append(next(loader))
    assert len(states[3]["plan"]["buffer"]) == 2000
    for k in (0, 3, 7):
        resumed = take(Loader(scale_dir / "train", **opts, state=states[k]), 10 - k)
        for a, b in zip(resumed, straight[k:], strict=True):
            for key in ("index", "epoch", "label", "spectrogram"):
                assert np.array_equal(a[key], b[key]), (k, key)


MEMORY = """
import json, sys
from pathlib import Path
from birdjepa.data import Loader
files = sys.argv[1:]
loader = Loader(files, seed=0, batch_size=4, n_workers=2, prefetch_batches=1)  # little in flight
seen = 0
while seen < 2 * sum(loader.shard_sizes):  # every row read, twice
    seen += len(next(loader)["index"])
status = dict(l.split(":", 1) for l in Path("/proc/self/status").read_text().splitlines())
print(json.dumps({k: int(status[k].split()[0]) for k in ("RssAnon", "RssFile")}))
"""


@pytest.mark.slow  # reads the whole scale set twice: CI runs it
def test_the_loaders_own_memory_does_not_grow_with_the_shards_it_reads(scale_dir: Path) -> None:
    shards = [str(p) for p in list_shards(scale_dir / "train")]
    kib = {}
    for n in (5, 50):
        done = subprocess.run([sys.executable, "-c", MEMORY, *shards[:n]], capture_output=True, text=True,
                              env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, check=True)  # fmt: skip
        kib[n] = json.loads(done.stdout.strip().splitlines()[-1])
    data_kib = sum(Path(p).stat().st_size for p in shards[5:]) // 1024
    # The 45 more shards hold ~data_kib more audio, all of it read twice; the heap grows by far less
    # (mapped shard pages are file-backed: the kernel drops them under pressure). Batches of 4 clips
    # (1 MiB of spectrograms), one prefetched: how many the workers hold ready when the process is
    # measured depends on the machine's load (with 64-clip batches, 16 MiB each, and 2 prefetched, a
    # CI run under load measured 21 MiB more; idle runs 0-1 MiB).
    assert data_kib > 20_000
    assert kib[50]["RssAnon"] - kib[5]["RssAnon"] < 8 * 1024, (kib, data_kib)
