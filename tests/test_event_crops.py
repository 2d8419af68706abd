"""Event windows: with ``crop_events`` each train view is centred on a point inside one of its row's
events (BirdSet's ``detected_events``: [start, end] seconds), rows without events keep the uniform crop,
the batch's ``crop_offset`` shows where each view came from, and the stream resumes exactly."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from birdjepa.data import DataError, Loader, StateError
from birdjepa.data.shards import read_shard

RATE, CLIP = 32_000, 160_000


def events_for(seconds: float, n: int) -> list[list[float]]:
    """``n`` short events of a recording of ``seconds``, clear of both ends (no clamped crop)."""
    usable = seconds - CLIP / RATE
    return [
        [CLIP / RATE / 2 + usable * (k + 0.45) / n, CLIP / RATE / 2 + usable * (k + 0.55) / n]
        for k in range(n)
    ]


@pytest.fixture(scope="module")
def with_events(
    demo_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[str], dict[int, list]]:
    """The demo train shards with a ``detected_events`` column as BirdSet types it (list of lists): the
    first two recordings of 8 s or more get one and two events; every other row none."""
    out = tmp_path_factory.mktemp("events")
    files, events, first = [], {}, 0
    for shard in sorted((demo_dir / "train").glob("*.arrow")):
        table = read_shard(shard)
        column = []
        for r, audio in enumerate(table.column("audio").to_pylist()):
            seconds = sf.info(io.BytesIO(audio["bytes"])).duration
            if len(events) < 2 and seconds >= 8:
                events[first + r] = events_for(seconds, len(events) + 1)
            column.append(events.get(first + r))
        first += len(table)
        table = table.append_column("detected_events", pa.array(column, pa.list_(pa.list_(pa.float64()))))
        files.append(str(out / shard.name))
        with pa.OSFile(files[-1], "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=64)
    (out / "vocab.json").write_bytes((demo_dir / "train" / "vocab.json").read_bytes())
    return files, events


def offsets_by_index(files: list[str], batches: int, **options: object) -> dict[int, np.ndarray]:
    with Loader(files, batch_size=16, n_views=2, seed=4, **options) as loader:
        out: dict[int, np.ndarray] = {}
        for _ in range(batches):
            b = next(loader)
            out.update({int(i): o for i, o in zip(b["index"], b["crop_offset"], strict=True)})
    return out


def test_views_are_centred_inside_an_event_and_rows_without_events_crop_uniformly(
    with_events: tuple[list[str], dict[int, list]],
) -> None:
    files, events = with_events
    on = offsets_by_index(files, 30, crop_events=True)  # more than an epoch: every row seen
    off = offsets_by_index(files, 30)
    assert set(events) <= set(on) and len(events) == 2
    for row, windows in events.items():
        for offset in on[row]:
            centre = (offset + CLIP // 2) / RATE
            assert any(s <= centre < e + 1 / RATE for s, e in windows), (row, centre, windows)
    # The other rows draw exactly the uniform crops of a run without the option.
    others = [i for i in on if i not in events]
    assert others and all(np.array_equal(on[i], off[i]) for i in others)


def test_event_crops_resume_exactly_and_a_state_names_the_option(
    with_events: tuple[list[str], dict[int, list]],
) -> None:
    files, _ = with_events
    with Loader(files, batch_size=16, n_views=2, seed=4, crop_events=True) as loader:
        for _ in range(3):
            next(loader)
        state = loader.state()
        straight = [next(loader) for _ in range(3)]
    with Loader(files, batch_size=16, n_views=2, seed=4, crop_events=True, state=state) as again:
        resumed = [next(again) for _ in range(3)]
    for a, b in zip(straight, resumed, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(StateError, match=r"event_column: saved detected_events now \(absent\)"):
        Loader(files, batch_size=16, n_views=2, seed=4, state=state)


def test_a_bad_event_is_a_counted_skip_naming_it(
    with_events: tuple[list[str], dict[int, list]], tmp_path: Path
) -> None:
    files, _ = with_events
    table = read_shard(Path(files[0]))
    # End before start; and past the recording's end (milliseconds read as seconds), which was clamped
    # to the recording's last clip without a word.
    bad = [[[5.0, 4.0]], [[1.0, 2.0], [5000.0, 6000.0]]] + [None] * (len(table) - 2)
    table = table.set_column(
        table.schema.get_field_index("detected_events"),
        "detected_events",
        pa.array(bad, pa.list_(pa.list_(pa.float64()))),
    )
    path = tmp_path / "bad.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=64)
    (tmp_path / "vocab.json").write_bytes((Path(files[0]).parent / "vocab.json").read_bytes())
    with Loader([str(path)], batch_size=4, seed=1, crop_events=True) as loader:
        for _ in range(len(table) // 4 + 1):
            next(loader)
        diagnostics = loader.diagnostics()
    assert diagnostics["counters"]["skipped"] >= 1
    assert any(
        s["row"] == 0 and "event 0: [5, 4] s is not a window" in s["reason"] for s in diagnostics["skipped"]
    )
    assert any(
        s["row"] == 1 and "event 1: starts at 5000 s, at or past the recording's end (" in s["reason"]
        for s in diagnostics["skipped"]
    ), diagnostics["skipped"]


def test_an_event_column_no_shard_has_is_an_error_naming_it(
    with_events: tuple[list[str], dict[int, list]],
) -> None:
    # Rows without events keep the uniform crop: a misnamed column (a typo) trained on uniform crops only,
    # exit 0.
    files, _ = with_events
    with pytest.raises(
        DataError, match=r"event_column 'detected_event': no shard has it, .* columns .*detected_events"
    ):
        Loader(files, batch_size=4, seed=1, crop_events=True, event_column="detected_event")
