"""Loader benchmark: every figure measured side by side in this one run, on the same shards.

    python scripts/bench_loader.py [--batches 20] [--data DIR]

Prints clips/s of the Rust loader with 1 and 2 workers, of a plain numpy + soundfile + scipy
pipeline doing the same work (decode, mono, resample to 32 kHz, 5 s crop, log-mel, normalise),
of the loader on the same audio stored by path (HF's Audio with null bytes, one file per recording,
on the same disk), decode alone and fbank alone in both, and time to the first batch cold vs after
restoring a state whose shuffle buffer holds 10 000 indices.
"""

# ruff: noqa: E402  (the BLAS thread count must be set before numpy is imported)
from __future__ import annotations

import os

# numpy's BLAS threads spin after each call and would steal the loader's cores; the plain
# pipeline is measured on one core anyway.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import io
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import soundfile as sf
from scipy.signal import resample_poly

from birdjepa import _rs
from birdjepa.data import Features, Loader, resolve_files, take
from birdjepa.synthetic.codecs import encode_audio
from birdjepa.synthetic.demo import ensure_demo_data

# The numpy reference fbank of the parity tests is the plain pipeline's fbank (one implementation).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from path_only import path_only
from reference_fbank import log_mel as reference_log_mel

FEATURES = Features()
CLIP = round(FEATURES.clip_seconds * FEATURES.target_rate)


def read_audio_bytes(files: list[str]) -> list[bytes]:
    out: list[bytes] = []
    for path in files:
        with ipc.open_file(path) as f:
            out.extend(a["bytes"] for a in f.read_all().column("audio").to_pylist())
    return out


def plain_pipeline(data: bytes, rng: np.random.Generator) -> np.ndarray:
    """What a researcher writes without this project: decode all, resample all, crop, fbank."""
    x, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    if sr != FEATURES.target_rate:
        g = math.gcd(sr, FEATURES.target_rate)
        x = resample_poly(x, FEATURES.target_rate // g, sr // g).astype(np.float32)
    start = int(rng.integers(0, max(len(x) - CLIP, 0) + 1))
    clip = np.zeros(CLIP, np.float32)
    seg = x[start : start + CLIP]
    clip[: len(seg)] = seg
    mel = reference_log_mel(clip).astype(np.float32)[: FEATURES.n_frames]
    out = np.zeros((FEATURES.n_frames, FEATURES.n_mels), np.float32)
    out[: len(mel)] = (mel - FEATURES.mean) / FEATURES.std
    return out


def rate(n: int, fn: Callable[[], object]) -> tuple[float, float]:
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    return n / elapsed, elapsed


def loader_rate(files: list[str], workers: int, batches: int, batch_size: int, n_views: int = 1) -> float:
    loader = Loader(
        files, seed=0, batch_size=batch_size, n_workers=workers, shuffle_buffer=1024, n_views=n_views
    )
    take(loader, 2)  # warm: threads started, resamplers built, pages mapped
    return rate(batches * batch_size, lambda: take(loader, batches))[0]


def write_wide_set(folder: Path, rows: int) -> list[str]:
    """A set with many rows (short clips, a few hundred distinct recordings repeated) for the
    restore benchmark: the shuffle buffer may not hold more than one epoch."""
    rng = np.random.default_rng(7)
    t = np.arange(16_000) / 32_000
    distinct = []
    for i in range(200):
        f0 = 1500 + 40 * i
        x = 0.3 * np.sin(2 * np.pi * (f0 * t + 800 * t**2)) + 0.01 * rng.standard_normal(len(t))
        distinct.append(encode_audio(x.astype(np.float32), 32_000, "ogg", ogg_serial=i))
    audio = pa.array([{"bytes": distinct[i % 200], "path": f"r{i}.ogg"} for i in range(rows)])
    table = pa.table({"audio": audio, "ebird_code": pa.array([i % 12 for i in range(rows)], pa.int64())})
    paths = []
    for s in range(4):
        path = folder / f"wide-{s}.arrow"
        part = table.slice(s * rows // 4, rows // 4)
        with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as w:
            w.write_table(part, max_chunksize=64)
        paths.append(str(path))
    return paths


def open_seconds(files: list[str]) -> float:
    """Opening a loader: the shards' indexes and the data set's fingerprint (a stat per file by path)."""
    start = time.perf_counter()
    with Loader(files, batch_size=1, train=False):
        return time.perf_counter() - start


def first_batch_seconds(files: list[str], state: dict | None, batch_size: int) -> float:
    start = time.perf_counter()
    loader = Loader(files, seed=0, batch_size=batch_size, n_workers=2, shuffle_buffer=10_000, state=state)
    take(loader, 1)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=None, help="train shards (default: the demo set)")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--plain-clips", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    files = resolve_files(args.data if args.data else ensure_demo_data() / "train")
    audio = read_audio_bytes(files)
    infos = [sf.info(io.BytesIO(a)) for a in audio]
    fmts = {}
    for info in infos:
        fmts[info.format] = fmts.get(info.format, 0) + 1
    seconds = sum(i.duration for i in infos)
    print(
        f"data: {len(audio)} recordings, {seconds / len(audio):.1f} s mean, "
        f"formats {fmts}, {len(files)} shards"
    )

    rows: list[tuple[str, str, str]] = []
    rng = np.random.default_rng(0)
    picks = rng.choice(len(audio), size=args.plain_clips, replace=True)
    by_path_dir = tempfile.TemporaryDirectory()
    here = Path(by_path_dir.name)
    by_path = [str(path_only(Path(f), here / Path(f).name, here / "audio", relative_to=here)) for f in files]
    for f in files:  # the labels' vocabulary beside the shards, as beside the originals
        vocab = Path(f).with_name("vocab.json")
        if vocab.exists():
            (here / "vocab.json").write_bytes(vocab.read_bytes())
    ones, twos, paths, plains = [], [], [], []
    # Interleaved repeats, medians reported: drift on a shared machine hits every figure alike.
    for _ in range(args.repeats):
        ones.append(loader_rate(files, 1, args.batches, args.batch_size))
        twos.append(loader_rate(files, 2, args.batches, args.batch_size))
        paths.append(loader_rate(by_path, 2, args.batches, args.batch_size))
        plains.append(rate(len(picks), lambda: [plain_pipeline(audio[i], rng) for i in picks])[0])
    one, two, by_path_rate, plain = (float(np.median(x)) for x in (ones, twos, paths, plains))
    opens = {
        name: min(open_seconds(f) for _ in range(3)) for name, f in (("bytes", files), ("path", by_path))
    }
    by_path_dir.cleanup()
    print(
        "repeats (clips/s): 1 worker",
        [round(x) for x in ones],
        "2 workers",
        [round(x) for x in twos],
        "2 workers by path",
        [round(x) for x in paths],
        "plain",
        [round(x, 1) for x in plains],
    )
    rows.append(("loader, 1 worker", f"{one:8.1f} clips/s", f"{one / plain:5.1f}x plain"))
    rows.append(("loader, 2 workers", f"{two:8.1f} clips/s", f"{two / one:5.2f}x 1 worker"))
    rows.append(("loader, 2 workers, audio by path", f"{by_path_rate:8.1f} clips/s",
                 f"{by_path_rate / two:5.2f}x bytes in the shard"))  # fmt: skip
    rows.append(("open (fingerprint), audio by path", f"{opens['path']:8.3f} s",
                 f"{opens['path'] - opens['bytes']:+.3f} s vs bytes"))  # fmt: skip
    rows.append(("plain numpy+soundfile+scipy, 1 core", f"{plain:8.1f} clips/s", "1.0x"))

    sample = [audio[i] for i in picks[:24]]
    rs_dec, _ = rate(len(sample), lambda: [_rs.decode_audio(a) for a in sample])
    sf_dec, _ = rate(len(sample), lambda: [sf.read(io.BytesIO(a), dtype="float32") for a in sample])
    rows.append(
        ("decode alone (whole file), Rust", f"{rs_dec:8.1f} files/s", f"{rs_dec / sf_dec:5.2f}x soundfile")
    )
    rows.append(("decode alone (whole file), soundfile", f"{sf_dec:8.1f} files/s", "1.0x"))

    clip = np.asarray(rng.standard_normal(CLIP), np.float32)
    rs_fb, _ = rate(200, lambda: [_rs.log_mel(clip) for _ in range(200)])
    np_fb, _ = rate(20, lambda: [reference_log_mel(clip) for _ in range(20)])
    rows.append(("fbank alone (5 s clip), Rust", f"{rs_fb:8.1f} clips/s", f"{rs_fb / np_fb:5.1f}x numpy"))
    rows.append(("fbank alone (5 s clip), numpy", f"{np_fb:8.1f} clips/s", "1.0x"))

    with tempfile.TemporaryDirectory() as tmp:
        wide = write_wide_set(Path(tmp), 12_000)
        first_batch_seconds(wide, None, args.batch_size)  # build the shard indexes once
        loader = Loader(wide, seed=0, batch_size=args.batch_size, n_workers=2, shuffle_buffer=10_000)
        take(loader, 3)
        state = loader.state()
        assert len(state["plan"]["buffer"]) == 10_000
        del loader
        cold = min(first_batch_seconds(wide, None, args.batch_size) for _ in range(3))
        warm = min(first_batch_seconds(wide, state, args.batch_size) for _ in range(3))
    rows.append(("first batch, cold start (12k rows)", f"{cold:8.3f} s", "1.0x"))
    rows.append(("first batch, restored 10k-slot buffer", f"{warm:8.3f} s", f"{warm - cold:+.3f} s vs cold"))

    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure':<{width}}  {'value':>16}  ratio")
    for name, value, ratio in rows:
        print(f"{name:<{width}}  {value:>16}  {ratio}")


if __name__ == "__main__":
    main()
