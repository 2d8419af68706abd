"""`birdjepa prepare` on Parquet from the hub, against the disk: both measured side by side in this run.

    python scripts/bench_prepare.py [--data DIR] [--repeats 3]

Writes the demo set's train shards (default) as `datasets` writes Parquet (`to_parquet`, snappy, the
HF features in the schema), then times, interleaved, the conversion into shards (every byte of the
audio copied: read, decompressed, written) and a plain copy of the same Parquet files (`shutil.copyfile`:
the disk's read and write at this file size), both on a warm page cache. Prints MiB/s of each (MiB of
Parquet in, per second) and their ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import datasets

from birdjepa.data import resolve_files
from birdjepa.data.parquet import convert, parquet_files
from birdjepa.data.shards import read_shard
from birdjepa.synthetic.demo import ensure_demo_data


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=None, help="shards to write as Parquet (default: demo)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shards = resolve_files(args.data if args.data else ensure_demo_data() / "train")
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as tmp:
        hub = Path(tmp) / "hub"
        hub.mkdir()
        for i, shard in enumerate(shards):
            datasets.Dataset(read_shard(Path(shard))).to_parquet(str(hub / f"{i:04d}.parquet"))
        files = parquet_files(hub)
        mib = sum(f.stat().st_size for f in files) / 2**20
        converts, copies = [], []
        for r in range(args.repeats):
            out = Path(tmp) / f"shards-{r}"
            t0 = time.perf_counter()
            done = convert(files, out, label_column="ebird_code")
            converts.append(time.perf_counter() - t0)
            copied = Path(tmp) / f"copy-{r}"
            copied.mkdir()
            t0 = time.perf_counter()
            for f in files:
                shutil.copyfile(f, copied / f.name)
            copies.append(time.perf_counter() - t0)
            shutil.rmtree(out)
            shutil.rmtree(copied)
    convert_rate, copy_rate = mib / statistics.median(converts), mib / statistics.median(copies)
    print(
        f"data: {len(files)} Parquet files, {mib:.0f} MiB, {done.rows} rows; "
        f"{args.repeats} interleaved repeats"
    )
    print(f"prepare (Parquet -> shards)  {convert_rate:8.0f} MiB/s  ({[round(mib / t) for t in converts]})")
    print(f"copy of the same files       {copy_rate:8.0f} MiB/s  ({[round(mib / t) for t in copies]})")
    print(f"ratio                        {convert_rate / copy_rate:8.2f}x the disk's copy")


if __name__ == "__main__":
    main()
