"""A shard rewritten with its audio by path, as the cache of a `datasets` loading script holds BirdSet:
for tests/test_audio_by_path.py and scripts/bench_loader.py (the same audio stored both ways)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa

from birdjepa.data.shards import read_shard

EXTENSIONS = {b"fLaC": ".flac", b"OggS": ".ogg", b"RIFF": ".wav"}


def path_only(shard: Path, out: Path, audio_dir: Path, *, relative_to: Path | None = None) -> Path:
    """``shard`` rewritten into ``out`` in its own HF schema (stream format, as `datasets` caches it)
    with every recording written once to ``audio_dir`` and the struct's ``bytes`` null; paths relative
    to ``relative_to`` (absolute when None)."""
    table = read_shard(shard)
    audio = table.column("audio").combine_chunks()
    paths = []
    for data in audio.field("bytes").to_pylist():
        name = hashlib.sha256(data).hexdigest()[:16] + EXTENSIONS.get(data[:4], ".mp3")
        file = audio_dir / name
        if not file.exists():  # a soundscape's 5 s windows all name its one file
            audio_dir.mkdir(parents=True, exist_ok=True)
            file.write_bytes(data)
        paths.append(str(file.relative_to(relative_to) if relative_to else file))
    by_path = pa.StructArray.from_arrays(
        [pa.nulls(len(paths), pa.binary()), pa.array(paths, pa.string())], fields=list(audio.type)
    )
    table = table.set_column(table.schema.get_field_index("audio"), "audio", by_path)
    assert table.column("audio").combine_chunks().field("bytes").null_count == len(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    with pa.ipc.new_stream(str(out), table.schema) as writer:  # the schema's HF metadata kept
        writer.write_table(table, max_chunksize=8)
    return out
