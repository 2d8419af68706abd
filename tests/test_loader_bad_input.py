"""Invariant 6: bad input is never silent and never a hang."""

from __future__ import annotations

import json
import re
import shlex
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from birdjepa.data import DataError, Loader, WorkerError, open_shards, take


def read_table(path: Path) -> pa.Table:
    with ipc.open_file(path) as f:
        return f.read_all()


def write_table(table: pa.Table, path: Path, fmt: str = "file", rows: int = 4) -> Path:
    opener = ipc.new_file if fmt == "file" else ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=rows)
    return path


def first_shard(demo_dir: Path) -> Path:
    return sorted((demo_dir / "train").glob("*.arrow"))[0]


def with_corrupt_rows(table: pa.Table, rows: set[int]) -> pa.Table:
    audio = table.column("audio").combine_chunks()
    data = audio.field("bytes").to_pylist()
    for r in rows:
        data[r] = b"RIFF\x00\x00 this is not audio" if r % 2 else b"OggS" + bytes(200)
    fixed = pa.StructArray.from_arrays(
        [pa.array(data, pa.binary()), audio.field("path")], fields=list(audio.type)
    )
    return table.set_column(table.schema.get_field_index("audio"), "audio", fixed)


@pytest.fixture(scope="module")
def corrupt_dir(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corrupt")
    table = read_table(first_shard(demo_dir))
    write_table(with_corrupt_rows(table, {1, 4}), out / "a.arrow")
    write_table(table, out / "b.arrow")
    return out


def loader(folder: Path, **kw: object) -> Loader:
    opts: dict = {"seed": 1, "batch_size": 3, "n_workers": 2, "shuffle_buffer": 6}
    opts.update(kw)
    return Loader(folder, **opts)


def test_undecodable_records_are_skipped_counted_and_named(corrupt_dir: Path) -> None:
    ld = loader(corrupt_dir)
    n = len(ld)
    batches = take(ld, (2 * n) // 3 + 4)  # more than two epochs
    seen = np.concatenate([b["index"] for b in batches])
    assert not ({1, 4} & set(seen.tolist())), "a corrupt record was yielded"
    assert all(len(b["index"]) == 3 for b in batches)
    diag = ld.diagnostics()
    assert diag["counters"]["skipped"] >= 4  # both bad rows, in at least two epochs
    reported = {(s["shard"], s["row"], s["index"]) for s in diag["skipped"]}
    assert reported == {(0, 1, 1), (0, 4, 4)}
    assert all(s["file"].endswith("a.arrow") and s["reason"] for s in diag["skipped"])


def test_a_train_pass_that_can_read_no_record_is_an_error_not_a_wait_for_ever(
    demo_dir: Path, tmp_path: Path
) -> None:
    # Audio no decoder reads (IMA-ADPCM WAVs pass `prepare --check`): pretrain waited for its first batch
    # for ever, printing nothing, deaf to SIGTERM. A long run of skips that every record failed in is the
    # error; an epoch's worth alone gave up on data whose good records had been read (below).
    table = read_table(first_shard(demo_dir))
    write_table(with_corrupt_rows(table, set(range(len(table)))), tmp_path / "a.arrow")
    raised: list[BaseException] = []

    def first_batch() -> None:
        try:
            next(loader(tmp_path))
        except DataError as e:
            raised.append(e)

    waiting = threading.Thread(target=first_batch, daemon=True)  # a regression waits: fail, not hang
    waiting.start()
    waiting.join(timeout=60)
    n = len(table)
    said = rf"none of the {n} records can be read: each was skipped in a run of 64 skips in a row \(the "
    said += "last: "
    assert len(raised) == 1 and re.match(
        said + re.escape(str(tmp_path / "a.arrow")) + " row ", str(raised[0])
    ), raised
    # Three good records of the shard, the rest unreadable: a run of as many skips as records, across an
    # epoch's boundary, said "none of the records can be read" 11 to 59 batches in (a helper's hunt).
    (tmp_path / "some").mkdir()
    write_table(with_corrupt_rows(table, set(range(3, n))), tmp_path / "some" / "a.arrow")
    for seed in range(3):
        batches = take(loader(tmp_path / "some", seed=seed, batch_size=2), 40)
        assert {int(i) for b in batches for i in b["index"]} == {0, 1, 2}


def test_a_recording_with_samples_that_are_not_finite_is_skipped_not_read_as_silence(
    demo_dir: Path, tmp_path: Path
) -> None:
    # A float WAV with NaN samples: every frame with one hit the filter bank's log floor, and the record
    # was trained on as silence without a word.
    import io

    import soundfile

    samples = (0.3 * np.sin(np.arange(6 * 32000) / 10)).astype(np.float32)
    samples[::1000] = np.nan  # in every crop
    wav = io.BytesIO()
    soundfile.write(wav, samples, 32000, format="WAV", subtype="FLOAT")
    table = read_table(first_shard(demo_dir))
    audio = table.column("audio").combine_chunks()
    data = audio.field("bytes").to_pylist()
    data[1] = wav.getvalue()
    fixed = pa.StructArray.from_arrays(
        [pa.array(data, pa.binary()), audio.field("path")], fields=list(audio.type)
    )
    write_table(table.set_column(table.schema.get_field_index("audio"), "audio", fixed), tmp_path / "a.arrow")
    ld = loader(tmp_path, train=False)
    assert 1 not in np.concatenate([b["index"] for b in ld]).tolist()
    ((row, reason),) = [(s["row"], s["reason"]) for s in ld.diagnostics()["skipped"]]
    assert row == 1 and "a sample that is not finite (NaN or inf) at frame " in reason, reason


def test_an_eval_pass_says_in_one_line_which_records_it_skipped(
    corrupt_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What evaluate, embed and benchmark read through: each read fewer rows than the shards hold and said
    # nothing ("embedded 2 clips" of 4).
    ld = loader(corrupt_dir, train=False)
    for _ in range(2):  # each pass says its own, once
        capsys.readouterr()
        rows = sum(len(b["index"]) for b in ld)
        assert next(ld, None) is None
        said = capsys.readouterr().out.splitlines()
        a = re.escape(str(corrupt_dir / "a.arrow"))
        assert rows == len(ld) - 2 and len(said) == 1, said
        assert re.fullmatch(rf"WARNING skipped 2 records the loader cannot read: {a} row 1: decode: [^;]+; "
                            rf"{a} row 4: decode: [^;]+", said[0]), said  # fmt: skip


def test_skips_are_deterministic_across_workers_and_resume(corrupt_dir: Path) -> None:
    straight = loader(corrupt_dir, n_workers=1)
    head = take(straight, 5)
    state = straight.state()
    tail = take(straight, 8)
    other = take(loader(corrupt_dir, n_workers=4), 13)
    for a, b in zip(head + tail, other, strict=True):
        assert np.array_equal(a["index"], b["index"]) and np.array_equal(a["spectrogram"], b["spectrogram"])
        assert np.array_equal(a["crop_offset"], b["crop_offset"])
    resumed = loader(corrupt_dir, state=state)
    for a, b in zip(take(resumed, 8), tail, strict=True):
        assert np.array_equal(a["index"], b["index"])
    assert resumed.diagnostics()["counters"] == straight.diagnostics()["counters"]


def test_crop_offsets_stay_aligned_with_rows_when_records_are_skipped(
    demo_dir: Path, corrupt_dir: Path, tmp_path: Path
) -> None:
    """The same shards without the corrupt rows plan the same (index, epoch) stream; every kept row
    carries the crop offset its sample gets there."""
    table = read_table(first_shard(demo_dir))
    write_table(table, tmp_path / "a.arrow")
    write_table(table, tmp_path / "b.arrow")
    n = len(table)

    def offsets(folder: Path) -> dict[tuple[int, int], int]:
        """(epoch, index) -> crop offset over the first ``n`` batches (1.5 epochs)."""
        out = {}
        for b in take(loader(folder), n):
            assert b["crop_offset"].shape == b["index"].shape
            for e, i, o in zip(b["epoch"], b["index"], b["crop_offset"], strict=True):
                out[int(e), int(i)] = int(o)
        return out

    clean, skipped = offsets(tmp_path), offsets(corrupt_dir)
    assert not {i for _, i in skipped} & {1, 4}
    shared = [k for k in skipped if k in clean]
    assert len(shared) > n and any(skipped[k] for k in shared)
    assert [skipped[k] for k in shared] == [clean[k] for k in shared]


def test_missing_column_names_file_and_column(demo_dir: Path, tmp_path: Path) -> None:
    table = read_table(first_shard(demo_dir)).drop_columns(["ebird_code"])
    bad = write_table(table, tmp_path / "nolabel.arrow")
    with pytest.raises(DataError, match=r"nolabel\.arrow.*missing column 'ebird_code'"):
        loader(bad)
    with pytest.raises(DataError, match=r"missing column 'sound'"):
        loader(first_shard(demo_dir), audio_column="sound")


def test_a_label_past_the_vocabulary_beside_it_stops_the_loader_naming_the_row(
    demo_dir: Path, tmp_path: Path
) -> None:
    # It was read as a class no probe has (evaluate counted those clips wrong, exit 0; a run's probe
    # loss went NaN).
    table = read_table(first_shard(demo_dir)).slice(0, 4)
    names = json.loads((demo_dir / "train" / "vocab.json").read_text())["names"]
    at = table.schema.get_field_index("ebird_code")
    table = table.set_column(at, "ebird_code", pa.array([0, 1, len(names) + 2, 0], pa.int64()))
    bad = write_table(table, tmp_path / "past.arrow")
    (tmp_path / "vocab.json").write_text(json.dumps({"names": names}))
    with pytest.raises(DataError) as e:
        list(Loader(bad, seed=0, batch_size=4, train=False))
    vocab = tmp_path / "vocab.json"
    said = f"past.arrow: row 2: label {len(names) + 2} is outside {vocab}'s {len(names)} names"
    assert said in str(e.value)
    # Below -1 (the one negative that means none): it came out as the label -5, with a vocabulary or not.
    table = table.set_column(at, "ebird_code", pa.array([0, -1, -5, 0], pa.int64()))
    for folder in (tmp_path, tmp_path / "plain"):
        folder.mkdir(exist_ok=True)
        with pytest.raises(DataError, match=r"below\.arrow: row 2: label -5 is neither a class index nor -1"):
            list(Loader(write_table(table, folder / "below.arrow"), seed=0, batch_size=4, train=False))


def test_shards_of_no_rows_name_the_first(demo_dir: Path, tmp_path: Path) -> None:
    # "the 1 shard(s) hold no rows" named neither a file nor a split.
    empty = write_table(read_table(first_shard(demo_dir)).slice(0, 0), tmp_path / "empty.arrow")
    with pytest.raises(DataError, match=re.escape(f"{empty}: no rows (every shard given is empty)")):
        loader(empty)


def test_wrong_column_type_names_file_and_column(demo_dir: Path, tmp_path: Path) -> None:
    table = read_table(first_shard(demo_dir))
    table = table.set_column(0, "audio", pa.array(range(len(table)), pa.int64()))
    bad = write_table(table, tmp_path / "inttype.arrow")
    with pytest.raises(DataError, match=r"inttype\.arrow: column 'audio' has type Int64"):
        loader(bad)


@pytest.mark.parametrize("fmt", ["file", "stream"])
def test_truncated_shard_names_the_file(demo_dir: Path, tmp_path: Path, fmt: str) -> None:
    whole = write_table(read_table(first_shard(demo_dir)), tmp_path / f"whole-{fmt}.arrow", fmt)
    data = whole.read_bytes()
    cut = tmp_path / f"cut-{fmt}.arrow"
    cut.write_bytes(data[: len(data) * 2 // 3])
    for opened in (loader, open_shards):  # the checks before a run opens the shards as the loader does
        with pytest.raises(DataError, match=rf"cut-{fmt}\.arrow: truncated shard"):
            opened(cut)
    take(loader(whole), 1)  # the intact copy reads fine
    assert open_shards(whole) == (loader(whole).fingerprint, len(loader(whole)), False)


def test_a_record_batch_header_that_lies_names_the_file(demo_dir: Path, tmp_path: Path) -> None:
    """A buffer past its batch's body (a flipped byte in the header) panicked in the arrow reader: a Rust
    backtrace, then a PanicException naming no file (at open, for the layout `prepare` writes); a
    negative row count wrapped to 2^64 - 3 rows; a dictionary replaced mid-stream (pandas Categorical
    chunks) was applied to every batch: an error, or other values, silently."""
    table = read_table(first_shard(demo_dir)).slice(0, 4)
    data = write_table(table, tmp_path / "whole.arrow", "stream").read_bytes()
    messages = ipc.MessageReader.open_stream(pa.py_buffer(data))
    messages.read_next_message()  # the schema
    batch = messages.read_next_message()
    meta, at = batch.metadata.to_pybytes(), data.find(batch.metadata.to_pybytes())
    audio_bytes = ipc.read_record_batch(batch, table.schema).column("audio").buffers()[3].size

    def lying(name: str, old: int, new: int) -> Path:
        assert meta.count(struct.pack("<q", old)) >= 1
        fields = meta.replace(struct.pack("<q", old), struct.pack("<q", new))
        (tmp_path / name).write_bytes(data[:at] + fields + data[at + len(meta) :])
        return tmp_path / name

    past = f"{tmp_path / 'past.arrow'}: corrupt record batch at byte {at - 8}: buffer 3 (offset 24, length "
    with pytest.raises(DataError, match=re.escape(past) + r"1099511627776\) is not inside its \d+-byte body"):
        loader(lying("past.arrow", audio_bytes, 1 << 40))
    from birdjepa.data.shards import read_shard  # pretrain's label count, with no vocab.json: a traceback

    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'past.arrow'}: a damaged Arrow IPC shard (")):
        read_shard(tmp_path / "past.arrow")
    with pytest.raises(DataError, match=r"neg\.arrow: corrupt record batch at byte \d+: a negative row"):
        loader(lying("neg.arrow", 4, -3))
    # The flatbuffer verifier's path through the tables: seven lines and two blank ones after the first.
    footer = write_table(table, tmp_path / "f.arrow").read_bytes()
    (tmp_path / "footer.arrow").write_bytes(footer.replace(struct.pack("<q", 4), struct.pack("<q", -3)))
    with pytest.raises(DataError, match=r"footer\.arrow: corrupt footer: ") as e:
        loader(tmp_path / "footer.arrow")
    assert "\n" not in str(e.value), str(e.value)
    schema = table.schema.append(pa.field("site", pa.dictionary(pa.int32(), pa.string())))
    parts = [
        pa.record_batch([*table.slice(i, 2).to_batches()[0].columns, pa.array(values).dictionary_encode()],
                        schema=schema)
        for i, values in ((0, ["a", "b"]), (2, ["x", "x"]))
    ]  # fmt: skip
    with pa.OSFile(str(tmp_path / "dict.arrow"), "wb") as sink, ipc.new_stream(sink, parts[0].schema) as w:
        for part in parts:
            w.write_batch(part)
    with pytest.raises(DataError, match=r"dict\.arrow: dictionary 0 is replaced at byte \d+: the loader"):
        loader(tmp_path / "dict.arrow")


@pytest.mark.parametrize("fmt", ["file", "stream"])
def test_a_shard_index_of_another_layout_at_the_same_size_and_time_is_not_trusted(
    demo_dir: Path, tmp_path: Path, fmt: str
) -> None:
    """A shard replaced at its size and modification time (`rsync -a`, `tar x`) kept the index cached
    beside it: a loader's open spun for ever, deaf to Ctrl-C and SIGTERM (the struct layout), or panicked
    blaming a valid row. An index whose end batches' headers disagree is built again; one whose middle
    disagrees stops the read in one line."""
    table = read_table(first_shard(demo_dir)).slice(0, 6)
    shard = write_table(table, tmp_path / "s.arrow", fmt, rows=2)
    want = take(loader(shard, train=False, n_workers=1), 2)
    index_file = tmp_path / ".s.arrow.bjindex.json"
    index = json.loads(index_file.read_text())
    assert [b["rows"] for b in index["batches"]] == [2, 2, 2]
    index["batches"][0]["rows"], index["batches"][-1]["rows"] = 3, 1  # another layout's rows, same bytes
    index_file.write_text(json.dumps(index))
    got = take(loader(shard, train=False, n_workers=1), 2)
    assert all(np.array_equal(a["spectrogram"], b["spectrogram"]) for a, b in zip(want, got, strict=True))
    assert [b["rows"] for b in json.loads(index_file.read_text())["batches"]] == [2, 2, 2]  # built again
    # A middle batch's: one line when it is read (a subprocess: the hang it was must not hold the suite).
    index["batches"][0]["rows"], index["batches"][-1]["rows"], index["batches"][1]["rows"] = 2, 2, 3
    index_file.write_text(json.dumps(index))
    code = f"from birdjepa.data import Loader, take; take(Loader({str(shard)!r}, train=False), 3)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" in done.stderr, done.stderr[-2000:]
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(f"_rs.DataError: {shard}: the record batch at byte ") and said.endswith(
        "holds 2 rows where the shard's index says 3: the file changed after it was indexed; remove its "
        ".bjindex.json (it is built again)"
    ), said


def test_not_arrow_names_the_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(DataError, match=r"junk\.arrow"):
        loader(junk)


def test_worker_panic_becomes_an_exception(demo_dir: Path) -> None:
    ld = loader(demo_dir / "train", debug_panic_index=3, shuffle_buffer=4)
    with pytest.raises(WorkerError, match=r"panicked on sample 3 \(.*\.arrow row"):
        take(ld, 100)
    with pytest.raises(WorkerError):  # the failure is sticky, never a silent continue
        take(ld, 1)


THREADS_SCRIPT = """
import gc, os, sys, time
from pathlib import Path
from birdjepa.data import Loader, take

def live() -> int:
    # The loader's workers by the name Rust gives them (comm holds 15 bytes).
    n = 0
    for task in os.listdir("/proc/self/task"):
        try:
            n += Path("/proc/self/task", task, "comm").read_text().startswith("birdjepa-loader")
        except FileNotFoundError:  # that thread ended after the listing
            pass
    return n

before = live()
ld = Loader(sys.argv[1], seed=1, batch_size=3, n_workers=4, shuffle_buffer=6)
take(ld, 1)
alive = live()
del ld
gc.collect()
# join() returns once a thread's code has ended; the kernel removes its /proc entry a moment later.
deadline = time.monotonic() + 2.0
while live() and time.monotonic() < deadline:
    time.sleep(0.001)
print(before, alive, live())
"""


def test_dropping_the_loader_joins_its_threads(demo_dir: Path) -> None:
    # A process of its own: another test's loader in this worker could end its threads between counts.
    out = subprocess.run(
        [sys.executable, "-c", THREADS_SCRIPT, str(demo_dir / "train")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    # The loader returns once all four workers run (named), and dropping it joins them.
    assert out == ["0", "4", "0"]


def test_gil_is_released_while_waiting(demo_dir: Path) -> None:
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=spin)
    t.start()
    # The loader opens once the spinner runs, and its batch is large: its worker starts decoding at once,
    # so a slow thread start on a loaded machine must not leave the batch ready before it is asked for
    # (CI once measured an 11 ms wait with 24 clips opened before the spinner started).
    ld = loader(demo_dir / "train", batch_size=96, n_workers=1)
    start = time.perf_counter()
    take(ld, 1)
    elapsed = time.perf_counter() - start
    stop.set()
    t.join()
    assert elapsed > 0.05
    # A Python loop does millions of ticks a second; with the GIL held it would get almost none.
    assert ticks > 20_000 * elapsed


CTRL_C_SCRIPT = """
import signal, sys, time
from birdjepa.data import Loader
# A background job of a non-interactive shell (e.g. `make test &`) starts with SIGINT ignored, and
# Python then leaves it ignored; put back the handler an interactive Ctrl-C meets.
signal.signal(signal.SIGINT, signal.default_int_handler)
ld = Loader(sys.argv[1], seed=0, batch_size=2048, n_workers=1, shuffle_buffer=8)
print("ready", flush=True)
try:
    next(ld)
    print("finished", flush=True)
except KeyboardInterrupt:
    print(f"interrupted {time.monotonic():.6f}", flush=True)
"""


def test_ctrl_c_interrupts_within_a_quarter_second(demo_dir: Path) -> None:
    # docs/data-loader.md's figure is about 0.1 s (one 100 ms poll of the Rust wait); measured 0-12 ms over 12
    # tries beside three test suites on 2 cores. 0.25 s leaves room for a loaded machine.
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT, str(demo_dir / "train")], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    words = out.split()
    assert words[0] == "interrupted", out
    assert float(words[1]) - sent < 0.25


CTRL_C_AS_A_BATCH_COMES = """
import json, os, signal, sys, threading, time
import numpy as np
from birdjepa.data import Loader, take
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Python has it
kw = dict(seed=5, batch_size=8, shuffle_buffer=16, n_workers=1)
straight = take(Loader(sys.argv[1], **kw), 12)
for trial in range(8):
    loader, got = Loader(sys.argv[1], **kw), []
    got.append(next(loader))
    threading.Timer(0.02 + 0.013 * trial, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        for b in loader:  # a researcher's loop that saves on Ctrl-C
            got.append(b)
            time.sleep(0.001)
    except KeyboardInterrupt:
        state = json.loads(json.dumps(loader.state()))
    resumed, went_on, want = next(Loader(sys.argv[1], state=state, **kw)), next(loader), straight[len(got)]
    same = [np.array_equal(b["index"], want["index"]) for b in (resumed, went_on)]
    print(trial, len(got), state["counters"]["batches"], *same, flush=True)
"""


def test_a_ctrl_c_as_a_batch_comes_keeps_it_for_the_next_call_and_out_of_the_state(demo_dir: Path) -> None:
    # A SIGINT during the Rust wait was raised by Python as the call returned: the batch was lost, and a
    # state saved on that Ctrl-C counted it (3 trials of 5 resumed a batch late). A race: 8 tries, each
    # with the Ctrl-C at another moment.
    done = subprocess.run([sys.executable, "-c", CTRL_C_AS_A_BATCH_COMES, str(demo_dir / "train")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert len(rows) == 8 and all(r[1] == r[2] and r[3:] == ["True", "True"] for r in rows), done.stdout


FORK_SCRIPT = """
import os, sys
from birdjepa.data import Loader, WorkerError
ld = Loader(sys.argv[1], seed=0, batch_size=4, n_workers=2)
next(ld)
child = os.fork()
if child == 0:
    try:
        next(ld)
    except WorkerError as e:
        print(f"child: {e}", flush=True)
    ld.close()  # dropped in the child: not the parent's threads to join
    sys.exit(0)
os.waitpid(child, 0)
print("parent:", next(ld)["index"].shape, flush=True)
"""


def test_a_loader_in_a_forked_process_says_it_has_no_workers_there(demo_dir: Path) -> None:
    # multiprocessing's default start on Linux is fork: there a batch was waited for for ever, and
    # dropping the loader panicked in Rust ("threads should not terminate unexpectedly").
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT, str(demo_dir / "train")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr
    child, parent = done.stdout.splitlines()
    said = r"child: this loader was opened in process \d+, and this is \d+, forked from it, where its worker"
    assert re.match(said + r" threads are not: open a loader in this process", child), child
    assert parent == "parent: (4,)"


OUT_OF_THREADS = """
import sys
from birdjepa.data import DataError, Loader
try:
    Loader(sys.argv[1], n_workers=64)
except DataError as e:
    print(e)
"""


def test_a_loader_that_cannot_start_its_workers_says_which_limit(demo_dir: Path, tmp_path: Path) -> None:
    # Under a cgroup's pids.max (or ulimit -u): a Rust panic's 30-line traceback, and the workers started
    # before it blocked for ever on a barrier.
    import os

    pids = Path("/sys/fs/cgroup/pids")
    group = pids / f"birdjepa-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as e:  # not root, or no cgroup v1 pids controller: CI's machine has both
        if os.environ.get("CI"):
            pytest.fail(f"cannot make a pids cgroup: {e}")
        pytest.skip(f"cannot make a pids cgroup: {e}")
    try:
        (group / "pids.max").write_text("40")
        cmd = shlex.join([sys.executable, "-c", OUT_OF_THREADS, str(demo_dir / "train")])
        start = f"echo $$ > {group / 'cgroup.procs'} && exec {cmd}"
        done = subprocess.run(["sh", "-c", start], capture_output=True, text=True, timeout=120)
    finally:
        group.rmdir()
    assert done.returncode == 0 and "Traceback" not in done.stderr and "panicked" not in done.stderr, done
    said = r"cannot start loader worker \d+ of 64: Resource temporarily unavailable \(os error 11\): a limit"
    assert re.match(
        said + r" on this process's threads \(ulimit -u, a cgroup's pids.max\); fewer", done.stdout
    ), done
