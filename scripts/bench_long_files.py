"""What a 5 s crop costs as recordings grow: clips/s per core against recording length, per codec.

    python scripts/bench_long_files.py [--work /tmp/birdjepa-long] [--lengths 10 60 600 3600]

For MP3 (constant bit rate, no Xing/Info header, as such files often come), Ogg Vorbis and FLAC, and
AIFF and M4A (AAC-LC at 96 kbps), which ffmpeg writes from the FLAC (skipped where no ffmpeg), one
recording of each length (synthetic bird-like song over noise, 32 kHz mono, written once into WORK) is
read by path from a shard of 64 rows that all name it; the Rust loader (train mode, one worker, one
view, random 5 s crops) draws 64 clips after a warm-up batch, in a fresh process per (codec, length) so
that its peak resident memory is its own. Prints clips/s, the ratio to the same codec's 10 s file (the
goal: within 1.3x at every length) and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import soundfile as sf

RATE = 32_000
CODECS = {"mp3": ("MP3", "MPEG_LAYER_III"), "ogg": ("OGG", "VORBIS"), "flac": ("FLAC", "PCM_16")}
#: Written by ffmpeg from the FLAC of the same length.
CONVERTED = {"aiff": ("-c:a", "pcm_s16be"), "m4a": ("-c:a", "aac", "-b:a", "96k")}
ROWS = 64


def write_recording(path: Path, seconds: int) -> None:
    """Chirps every second over quiet noise, written block by block (an hour never sits in memory)."""
    if (codec := path.suffix[1:]) in CONVERTED:
        flac = path.with_suffix(".flac")
        if not flac.exists():
            write_recording(flac, seconds)
        subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(flac), *CONVERTED[codec], str(path)],
                       check=True)  # fmt: skip
        return
    rng = np.random.default_rng(seconds)
    fmt, subtype = CODECS[path.suffix[1:]]
    extra = {"bitrate_mode": "CONSTANT"} if fmt == "MP3" else {}
    with sf.SoundFile(str(path), "w", RATE, 1, subtype, format=fmt, **extra) as f:
        t = np.arange(RATE) / RATE
        for s in range(seconds):
            chirp = 0.3 * np.sin(2 * np.pi * ((2000 + 30 * (s % 50)) * t + 900 * t**2)) * (t < 0.4)
            f.write((chirp + 0.01 * rng.standard_normal(RATE)).astype(np.float32))
    if fmt == "MP3":  # drop the Info frame LAME writes: the header-less case
        data = path.read_bytes()
        first = 144 * 128_000 // RATE  # 128 kbps at 32 kHz, no padding
        if b"Info" in data[:first] or b"Xing" in data[:first]:
            path.write_bytes(data[first:])


def shard_naming(recording: Path, out: Path) -> Path:
    audio = pa.StructArray.from_arrays(
        [pa.nulls(ROWS, pa.binary()), pa.array([recording.name] * ROWS)],
        fields=[pa.field("bytes", pa.binary()), pa.field("path", pa.string())],
    )
    table = pa.table({"audio": audio, "ebird_code": pa.array([0] * ROWS, pa.int64())})
    with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return out


def measure(shard: str) -> None:
    """In the child: clips/s of 64 random crops after a warm-up batch; prints JSON."""
    from birdjepa.data import Loader

    with Loader([shard], batch_size=16, n_workers=1, seed=0, shuffle_buffer=64) as loader:
        next(loader)
        start = time.perf_counter()
        for _ in range(4):
            next(loader)
        rate = 64 / (time.perf_counter() - start)
    # VmHWM, not ru_maxrss: Linux keeps the parent's peak in ru_maxrss across fork + exec.
    status = Path("/proc/self/status").read_text().splitlines()
    hwm_kib = int(next(line for line in status if line.startswith("VmHWM")).split()[1])
    print(json.dumps({"clips_s": rate, "max_rss_mib": hwm_kib / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/birdjepa-long"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 60, 600, 3600])
    parser.add_argument("--codecs", nargs="+", default=[*CODECS, *CONVERTED], choices=[*CODECS, *CONVERTED])
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return measure(args.measure)
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"{'codec':<5} {'length':>7} {'MiB':>7} {'clips/s':>8} {'vs 10 s':>8} {'peak RSS MiB':>13}")
    for codec in args.codecs:
        if codec in CONVERTED and shutil.which("ffmpeg") is None:
            print(f"{codec:<5} skipped: no ffmpeg on this machine to write it", flush=True)
            continue
        base = None
        for seconds in args.lengths:
            recording = args.work / f"r{seconds}.{codec}"
            if not recording.exists():
                write_recording(recording, seconds)
            shard = shard_naming(recording, args.work / f"r{seconds}-{codec}.arrow")
            done = subprocess.run([sys.executable, __file__, "--measure", str(shard)], capture_output=True,
                                  text=True, check=True)  # fmt: skip
            got = json.loads(done.stdout.strip().splitlines()[-1])
            base = base or got["clips_s"]
            print(f"{codec:<5} {seconds:>6}s {recording.stat().st_size / 2**20:7.1f} {got['clips_s']:8.1f} "
                  f"{base / got['clips_s']:7.2f}x {got['max_rss_mib']:13.0f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
