"""`prepare` (folder of audio files -> shards) and the shard writer it shares with demo-data."""

from __future__ import annotations

import errno
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet
import pytest
import soundfile as sf
from conftest import TINY_FREQS_HZ, TinyShards, tone

from birdjepa.cli import main
from birdjepa.data import Loader
from birdjepa.data.prepare import Check, PrepareError, find_audio_files, prepare, recording_ids
from birdjepa.data.shards import ShardWriter, list_shards, read_shard, read_vocab, remove_shards, shard_schema
from birdjepa.synthetic.codecs import CODECS, encode_audio

# relative path -> (codec, sample rate); labels are the first folder, root files have none
SRC_FILES = {
    "amecro/XC001.ogg": ("ogg_vorbis", 44100),
    "amecro/XC002.mp3": ("mp3", 48000),
    "amecro/sub/XC003.flac": ("flac_pcm16", 32000),
    "zzzfin/XC010.wav": ("wav_pcm24", 22050),
    "zzzfin/XC011.WAV": ("wav_float", 44100),
    "bbbwar/XC020.ogg": ("ogg_vorbis", 32000),
    "XC099.wav": ("wav_pcm16", 16000),
}


def make_src(root: Path, files: dict[str, tuple[str, int]] = SRC_FILES) -> Path:
    for i, (rel, (codec, sr)) in enumerate(sorted(files.items())):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(encode_audio(tone(500.0 + 100 * i, sr, 0.5), sr, codec, ogg_serial=i))
    (root / "notes.txt").write_text("not audio")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.ogg").write_bytes(b"ignored")
    return root


def table(out: Path) -> pa.Table:
    return pa.concat_tables([read_shard(p) for p in list_shards(out)])


def test_folder_labels_bytes_and_order(tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    result = prepare(src, tmp_path / "out")
    t = table(tmp_path / "out")
    assert t.schema.equals(shard_schema())
    paths = [a["path"] for a in t["audio"].to_pylist()]
    assert paths == sorted(SRC_FILES)  # sorted relative posix paths; notes.txt and .hidden skipped
    for a in t["audio"].to_pylist():
        assert a["bytes"] == (src / a["path"]).read_bytes()  # stored as-is
    label_column, vocab = read_vocab(tmp_path / "out")
    assert label_column == "ebird_code"
    assert vocab == result.vocab == ["amecro", "bbbwar", "zzzfin"]
    labels = {
        p: (None if lab is None else vocab[lab])
        for p, lab in zip(paths, t["ebird_code"].to_pylist(), strict=True)
    }
    assert labels == {p: (p.split("/")[0] if "/" in p else None) for p in SRC_FILES}
    assert t["recording_id"].to_pylist() == [p.rsplit(".", 1)[0] for p in paths]
    assert (result.n_files, result.n_unlabelled, result.skipped) == (len(SRC_FILES), 1, [])


def test_folders_that_are_links_are_followed_and_a_loop_is_not(tmp_path: Path) -> None:
    # os.walk left a linked label folder out without a word (its files were in no shard) and followed
    # a linked file: now both are packed, and a link back to a folder it is in is not followed.
    src = make_src(tmp_path / "src")
    disk2 = make_src(tmp_path / "disk2", {"robin/XC030.wav": ("wav_pcm16", 16000)})
    (src / "robin").symlink_to(disk2 / "robin", target_is_directory=True)
    (src / "amecro" / "again").symlink_to(src / "amecro", target_is_directory=True)
    (src / "amecro" / "sub" / "up").symlink_to(src, target_is_directory=True)
    assert find_audio_files(src) == sorted([*SRC_FILES, "robin/XC030.wav"])
    # Folders linked to each other: the walk grew without end (a mesh of three hung prepare), or packed a
    # recording many times under two labels. Each real folder is walked once, where it is.
    (src / "amecro" / "to_robin").symlink_to(src / "robin", target_is_directory=True)
    (disk2 / "robin" / "to_amecro").symlink_to(src / "amecro", target_is_directory=True)
    assert find_audio_files(src) == sorted([*SRC_FILES, "robin/XC030.wav"])


def test_two_files_of_one_name_but_their_extension_keep_it_in_their_recording_ids() -> None:
    # Both were 'sp/trunc': an embedding or a result could not be told apart by its recording.
    ids = recording_ids(["sp/trunc.wav", "sp/trunc.flac", "sp/other.ogg"])
    assert ids == {
        "sp/trunc.wav": "sp/trunc.wav",
        "sp/trunc.flac": "sp/trunc.flac",
        "sp/other.ogg": "sp/other",
    }


def test_loader_demo_counts_the_species_of_labelled_clips_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three label folders and a file directly in SRC (unlabelled, -1): it said "4 species seen".
    prepare(make_src(tmp_path / "src"), tmp_path / "out")
    capsys.readouterr()
    main(["loader-demo", "--data", str(tmp_path / "out"), "--batches", "3", "--batch-size", "7"])
    assert "; 3 species seen; " in capsys.readouterr().out


def test_shards_split_by_size_and_batches_capped(tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    result = prepare(src, tmp_path / "out", shard_mb=0.02)
    assert len(result.shards) >= 3 and result.shards == list_shards(tmp_path / "out")
    sizes = [sum(len(a["bytes"]) for a in read_shard(p)["audio"].to_pylist()) for p in result.shards]
    assert all(s >= 0.02 * 2**20 for s in sizes[:-1])
    assert table(tmp_path / "out")["audio"].to_pylist() == table_of(src)

    w = ShardWriter(tmp_path / "many", "x", target_bytes=1 << 30)
    for i in range(150):
        w.add(b"abc", f"{i}.wav", i % 3 if i % 7 else None, str(i))
    [path] = w.close()
    with pa.memory_map(str(path)) as f:
        reader = pa.ipc.open_file(f)
        assert [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)] == [64, 64, 22]
        assert reader.read_all()["ebird_code"].null_count == len([i for i in range(150) if i % 7 == 0])


def test_a_shard_writer_killed_before_it_closes_leaves_no_shard_a_loader_reads(tmp_path: Path) -> None:
    # Each shard was named once whole: a prepare killed mid-way left shards (and no vocab.json) that
    # pretrain took for a data set. Now they keep their hidden names until close; the next writer of
    # the prefix removes a killed one's.
    killed = ShardWriter(tmp_path, "x", target_bytes=8)
    for i in range(3):
        killed.add(b"0123456789", f"{i}.wav", 0, str(i))  # a shard each
    assert list_shards(tmp_path) == [] and len(list(tmp_path.glob(".x-*.arrow.partial"))) == 3
    w = ShardWriter(tmp_path, "x", target_bytes=8)  # the killed one's never closes
    assert list(tmp_path.iterdir()) == []
    w.add(b"0123456789", "a.wav", 0, "a")
    assert w.close() == list_shards(tmp_path) == [tmp_path / "x-00000.arrow"]


def table_of(src: Path) -> list[dict]:
    return [{"bytes": (src / p).read_bytes(), "path": p} for p in sorted(SRC_FILES)]


def test_csv_labels(tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label,extra\nXC099.wav,sonspa,1\n./amecro/XC002.mp3,amecro,2\nzzzfin/XC010.wav,,3\n")
    prepare(src, tmp_path / "out", labels_csv=csv)
    t = table(tmp_path / "out")
    _, vocab = read_vocab(tmp_path / "out")
    assert vocab == ["amecro", "sonspa"]
    got = dict(zip([a["path"] for a in t["audio"].to_pylist()], t["ebird_code"].to_pylist(), strict=True))
    assert got == {p: {"XC099.wav": 1, "amecro/XC002.mp3": 0}.get(p) for p in SRC_FILES}


CSV_ERRORS = [
    ("amecro/XC001.ogg,a\namecro/nothere.ogg,b", r"labels\.csv row 3: file 'amecro/nothere.ogg' not found"),
    ("amecro/XC001.ogg,a\n./amecro/XC001.ogg,b", r"row 3: path 'amecro/XC001.ogg' already labelled in row 2"),
    ("notes.txt,a", r"row 2: 'notes.txt' is not an audio file"),
    ("../x.ogg,a", r"row 2: path '../x.ogg' must be relative"),
    # A label cut at an unquoted comma ("Crow", the rest dropped); a quote never closed took the rows after
    # it into one label (a traceback past the field limit).
    ("amecro/XC001.ogg,Crow, American", r"row 2: more fields than the header's \(\[' American'\] left over"),
    ('amecro/XC001.ogg,"Crow\namecro/XC002.mp3,b', r"row 3: a line break inside a path or label"),
    ('amecro/XC001.ogg,"Crow\n' + "x" * 140_000, r"labels\.csv, past line 1: field larger than field limit"),
]


@pytest.mark.parametrize(("rows", "message"), CSV_ERRORS)
def test_csv_errors_name_the_row(tmp_path: Path, rows: str, message: str) -> None:
    src = make_src(tmp_path / "src")
    (tmp_path / "labels.csv").write_text(f"path,label\n{rows}\n")
    with pytest.raises(PrepareError, match=message):
        prepare(src, tmp_path / "out", labels_csv=tmp_path / "labels.csv")
    assert not (tmp_path / "out").exists()  # the CSV is checked before anything is written


def test_a_csv_not_in_utf8_is_one_line_and_a_name_matches_in_either_unicode_form(tmp_path: Path) -> None:
    # A spreadsheet's cp1252 was a UnicodeDecodeError's traceback; a name typed composed ("ñ") did not
    # find the file macOS stored decomposed, "not found" showing a name that looked the same.
    import unicodedata

    src = make_src(tmp_path / "src")
    (tmp_path / "cp1252.csv").write_bytes("path,label\namecro/XC001.ogg,pi\u00f1on\n".encode("cp1252"))
    with pytest.raises(PrepareError, match=r"cp1252\.csv: not UTF-8 text \(invalid .* at byte \d+\): save"):
        prepare(src, tmp_path / "out", labels_csv=tmp_path / "cp1252.csv")
    decomposed = unicodedata.normalize("NFD", "and\u00fa.wav")
    (src / "amecro" / "XC001.ogg").rename(src / "amecro" / decomposed)
    (tmp_path / "nfc.csv").write_text("path,label\namecro/and\u00fa.wav,amecro\n", encoding="utf-8")
    prepare(src, tmp_path / "out", labels_csv=tmp_path / "nfc.csv")
    paths = [a["path"] for a in table(tmp_path / "out")["audio"].to_pylist()]
    assert table(tmp_path / "out")["ebird_code"].to_pylist()[paths.index(f"amecro/{decomposed}")] == 0
    # A label in either form is one class: folders "piñon" stored decomposed (macOS) and composed, and a
    # CSV's label, were two (or three) classes of one name.
    (folders := tmp_path / "folders").mkdir()
    for form in ("NFC", "NFD"):
        (folders / unicodedata.normalize(form, "piñon")).mkdir()
        shutil.copy(src / "amecro" / decomposed, folders / unicodedata.normalize(form, "piñon") / "a.wav")
    assert prepare(folders, tmp_path / "out2").vocab == ["piñon"]
    (tmp_path / "nfd.csv").write_text(
        f"path,label\namecro/{decomposed},{unicodedata.normalize('NFD', 'piñon')}\n"
    )
    assert prepare(src, tmp_path / "out3", labels_csv=tmp_path / "nfd.csv").vocab == ["piñon"]


def test_csv_needs_path_and_label_columns(tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    (tmp_path / "labels.csv").write_text("file,species\nXC099.wav,a\n")
    with pytest.raises(PrepareError, match=r"labels\.csv: needs a header with columns 'path' and 'label'"):
        prepare(src, tmp_path / "out", labels_csv=tmp_path / "labels.csv")


def test_stream_format_and_label_column(tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    prepare(src, tmp_path / "file")
    result = prepare(src, tmp_path / "stream", fmt="stream", label_column="species", prefix="train")
    [path] = result.shards
    assert path.name == "train-00000.arrow"
    assert path.read_bytes()[:6] != b"ARROW1"  # stream format: no file magic
    with pa.memory_map(str(path)) as f:
        t = pa.ipc.open_stream(f).read_all()
    assert t.schema.equals(shard_schema("species"))
    assert read_vocab(tmp_path / "stream") == ("species", ["amecro", "bbbwar", "zzzfin"])
    ref = table(tmp_path / "file")
    assert t["audio"].equals(ref["audio"]) and t["species"].equals(ref["ebird_code"])
    # Read where vocab.json says (no command could: "missing column 'ebird_code'").
    batches = [next(iter(Loader(tmp_path / f, train=False, batch_size=8))) for f in ("file", "stream")]
    assert np.array_equal(batches[0]["label"], batches[1]["label"]) and (batches[0]["label"] >= 0).any()


def test_stream_shard_loads_in_hf_datasets(tmp_path: Path) -> None:
    import datasets

    src = make_src(tmp_path / "src")
    [path] = prepare(src, tmp_path / "out", fmt="stream").shards
    ds = datasets.Dataset.from_file(str(path))
    assert ds.num_rows == len(SRC_FILES)
    assert ds.features["audio"] == {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    assert ds[0]["audio"]["bytes"] == (src / ds[0]["audio"]["path"]).read_bytes()


def test_bad_file_error_names_the_file(tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    (src / "bbbwar" / "broken.ogg").write_bytes(b"OggS" + b"\0" * 100)
    (src / "bbbwar" / "empty.flac").write_bytes(b"")
    with pytest.raises(PrepareError, match=r"bbbwar/broken\.ogg: cannot decode"):
        prepare(src, tmp_path / "out", shard_mb=0.01)
    assert not list(Path(tmp_path / "out").glob("*")), "no half-written data set may be left"

    result = prepare(src, tmp_path / "out", skip_bad=True)
    assert [p for p, _ in result.skipped] == ["bbbwar/broken.ogg", "bbbwar/empty.flac"]
    assert "empty file" in result.skipped[1][1]
    assert result.n_files == len(SRC_FILES)
    assert len(table(tmp_path / "out")) == len(SRC_FILES)


@pytest.mark.parametrize(
    ("name", "form", "message"),
    [
        # Named ("cannot open codec unknown" was all it said), with what to do.
        ("x.ogg", ("OGG", "OPUS"), "cannot open codec Opus (convert it to FLAC or Ogg Vorbis)"),
        # libsndfile checked these: they passed, were packed, and were skipped at every epoch; a set of
        # them left pretrain waiting for a first batch for ever.
        ("x.wav", ("WAV", "IMA_ADPCM"), "cannot open codec ADPCM (convert it to FLAC or PCM WAV)"),
        ("x.wav", ("W64", "PCM_16"), "unrecognised container"),
        ("x.wav", ("WAV", "FLOAT"), "a sample that is not finite (NaN or inf) at frame 50"),  # was silence
        ("zero.ogg", ("OGG", "VORBIS"), "no audio frames"),  # passed the header check (a WAV's did not)
    ],
    ids=["opus", "ima-adpcm", "w64", "nan", "no-frames"],
)
@pytest.mark.parametrize("check", ["header", "full"])
def test_audio_the_loader_cannot_read_is_refused_by_its_own_decoder(
    tmp_path: Path, name: str, form: tuple[str, str], message: str, check: Check
) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    samples = tone(440.0, 48000, 0.2)[: 0 if name.startswith("zero") else None]
    if len(samples):
        samples[50] = np.nan
    buf = io.BytesIO()
    sf.write(
        buf, samples if form[1] == "FLOAT" else np.nan_to_num(samples), 48000, format=form[0], subtype=form[1]
    )
    (src / "a" / name).write_bytes(buf.getvalue())
    with pytest.raises(PrepareError, match=rf"a/{name}: cannot decode: .*{re.escape(message)}"):
        prepare(src, tmp_path / "out", check=check)


def test_full_check_and_existing_shards(tmp_path: Path) -> None:
    src = make_src(tmp_path / "src")
    prepare(src, tmp_path / "out", check="full", workers=1)
    with pytest.raises(FileExistsError, match="data-00000.arrow"):
        prepare(src, tmp_path / "out")
    removed = remove_shards(tmp_path / "out")
    assert {p.name for p in removed} == {"data-00000.arrow", "vocab.json"}
    with pytest.raises(PrepareError, match="no audio files"):
        prepare(tmp_path / "out", tmp_path / "out2")
    with pytest.raises(PrepareError, match="does not exist"):
        prepare(tmp_path / "missing", tmp_path / "out2")


def test_a_set_with_other_labels_is_refused_beside_shards_whose_vocabulary_it_would_replace(
    tmp_path: Path,
) -> None:
    # A shard's label is an index into its folder's vocab.json: written beside them under another prefix,
    # the second set's vocabulary relabelled the first set's rows without a word.
    first = prepare(make_src(tmp_path / "src"), tmp_path / "out", workers=1)
    before = (tmp_path / "out" / "vocab.json").read_text()
    other = make_src(
        tmp_path / "other", {"aaa/XC1.wav": ("wav_pcm16", 32000), "zzz/XC2.wav": ("wav_pcm16", 32000)}
    )
    with pytest.raises(PrepareError) as e:
        prepare(other, tmp_path / "out", prefix="b", workers=1)
    assert str(e.value) == (
        f"{tmp_path / 'out' / 'vocab.json'} is the vocabulary of the shards already in {tmp_path / 'out'} "
        "(e.g. data-00000.arrow), not of these (3 names against 2; label 0: 'amecro' against 'aaa'): writing "
        "theirs would relabel those shards; write these to a folder of their own (a split may name several "
        "folders)"
    )
    assert (
        list_shards(tmp_path / "out") == first.shards
        and (tmp_path / "out" / "vocab.json").read_text() == before
    )
    # The same labels (or this folder's vocabulary given with --vocab) are welcome.
    same = make_src(tmp_path / "same", {"bbbwar/XC3.wav": ("wav_pcm16", 32000)})
    prepare(same, tmp_path / "out", prefix="c", vocab_file=tmp_path / "out", workers=1)
    assert len(list_shards(tmp_path / "out")) == 2 and (tmp_path / "out" / "vocab.json").read_text() == before


def test_cli_prepare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_src(tmp_path / "src")
    main(["prepare", str(src), str(tmp_path / "out"), "--format", "stream", "--shard-mb", "0.02"])
    assert len(list_shards(tmp_path / "out")) >= 3
    assert "wrote 7 rows (1 without label)" in capsys.readouterr().out
    (src / "amecro" / "bad.mp3").write_bytes(b"nonsense" * 10)
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(src), str(tmp_path / "out2")])
    assert e.value.code == 2
    assert "amecro/bad.mp3" in capsys.readouterr().err
    main(["prepare", str(src), str(tmp_path / "out3"), "--skip-bad"])
    out = capsys.readouterr().out
    assert "skipped 1 bad file(s):\n  amecro/bad.mp3: cannot decode" in out and "no row" not in out
    # Out of file descriptors (ulimit -n under many --workers): good files skipped as bad, another set
    # at every run. The process's limit is no bad file: one line, nothing written.
    real = Path.read_bytes

    def out_of_descriptors(self: Path) -> bytes:
        if self.suffix == ".wav":
            raise OSError(errno.EMFILE, "Too many open files", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", out_of_descriptors)
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(src), str(tmp_path / "limited"), "--skip-bad"])
    err = capsys.readouterr().err
    assert (
        e.value.code == 2
        and ": cannot read: Too many open files: a limit of this process (ulimit -n: " in err
    )
    assert "not the file; fewer --workers, or a higher limit" in err and not list_shards(tmp_path / "limited")
    monkeypatch.undo()
    # A label whose every file was skipped stays in vocab.json: chance levels count it, unsaid.
    (src / "badwar").mkdir()
    (src / "badwar" / "x.wav").write_bytes(b"nonsense")
    main(["prepare", str(src), str(tmp_path / "out4"), "--skip-bad"])
    said = f"WARNING 1 label(s) have no row, every file of theirs skipped: badwar; they stay in {tmp_path}"
    assert said in capsys.readouterr().out
    # Audio of formats the loader does not read: left out, and a class of them gone, without a word.
    (src / "amecro" / "bad.mp3").unlink()
    (src / "badwar" / "x.wav").unlink()
    (src / "amecro" / "z.wma").write_bytes(b"\0")
    for name in ("x.aac", "y.opus"):
        (src / "badwar" / name).write_bytes(b"\0")
    (src / "notes.txt").write_text("not audio: no word of it")
    main(["prepare", str(src), str(tmp_path / "out5")])
    out = capsys.readouterr().out
    assert f"WARNING 3 audio file(s) under {src} left out (1 .aac, 1 .opus, 1 .wma; e.g. amecro/z.wma)" in out
    assert "WARNING label folder(s) badwar held only those: no class of theirs" in out and ".txt" not in out
    # Parquet beside them: the audio was left out without a word.
    pa.parquet.write_table(pa.table({"audio": [b""], "ebird_code": [0]}), src / "meta.parquet")
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(src), str(tmp_path / "out6")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{src} holds Parquet files and 7 audio file(s) (e.g. XC099.wav)" in err, err


def test_tiny_fixtures(
    tiny_shards: TinyShards, tiny_shards_stream: TinyShards, corrupt_shards: TinyShards
) -> None:
    """The shared fixtures hold what they claim (other test files rely on them)."""
    for fx in (tiny_shards, tiny_shards_stream):
        shards = list_shards(fx.path)
        assert [p.name for p in shards] == ["tiny-00000.arrow", "tiny-00001.arrow", "tiny-00002.arrow"]
        got = [(p.name, i, r) for p in shards for i, r in enumerate(read_shard(p).to_pylist())]
        assert len(got) == len(fx.rows) == 12
        for row, (shard, i, r) in zip(fx.rows, got, strict=True):
            assert (row.shard, row.row) == (shard, i)
            assert (row.recording_id, row.label) == (r["recording_id"], r["ebird_code"])
            x, sr = sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32", always_2d=True)
            assert (sr, x.shape[1]) == (row.sample_rate, row.channels)
            spectrum = np.abs(np.fft.rfft(x[:, 0]))
            assert np.fft.rfftfreq(len(x), 1 / sr)[spectrum.argmax()] == pytest.approx(row.freq_hz, abs=2)
            assert row.freq_hz == TINY_FREQS_HZ[row.label]
        assert {r.codec for r in fx.rows} == set(CODECS)
    vocab = json.loads((tiny_shards.path / "vocab.json").read_text())
    assert vocab == {"label_column": "ebird_code", "names": ["aaalow", "bbbmid", "ccchig"]}
    bad = {(r.shard, r.row) for r in corrupt_shards.corrupt}
    assert bad == {("tiny-00000.arrow", 2), ("tiny-00001.arrow", 2), ("tiny-00002.arrow", 1)}
    for p in list_shards(corrupt_shards.path):
        for i, r in enumerate(read_shard(p).to_pylist()):
            if (p.name, i) in bad:
                with pytest.raises(sf.LibsndfileError):
                    sf.read(io.BytesIO(r["audio"]["bytes"]))
            else:
                assert len(sf.read(io.BytesIO(r["audio"]["bytes"]))[0]) > 0


def test_cli_lists_and_dispatches_registered_subcommands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from birdjepa import cli

    calls = []

    def hello(name: str = "world", times: int = 1) -> None:
        """Say hello."""
        calls.append((name, times))

    monkeypatch.setitem(cli.COMMANDS, "hello", hello)
    monkeypatch.setitem(cli.COMMANDS, "broken", "birdjepa.no_such_module:main")
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    listing = capsys.readouterr().out
    for name in ("demo-data", "prepare", "hello", "broken"):
        assert f"{name} " in listing
    assert "unavailable" in listing
    main(["hello", "--name", "kiwi", "--times", "2"])
    assert calls == [("kiwi", 2)]
    with pytest.raises(ModuleNotFoundError):
        main(["broken"])


@pytest.mark.parametrize("form", ["object", "list", "broken"])
def test_a_vocabulary_is_read_one_way_by_the_loader_and_every_command(
    tmp_path: Path, tiny_shards: TinyShards, form: str
) -> None:
    # One reader (the Rust core's parse_vocab, the loader's own) behind the probes' class count and the
    # benchmark's class list: a plain list and {"names": ...} give the same classes; a broken file is
    # named by each.
    import shutil

    from birdjepa.benchmark.cli import BenchmarkError, _vocab
    from birdjepa.data import DataError
    from birdjepa.data.shards import label_count, vocab_names

    shutil.copytree(tiny_shards.path, tmp_path / "s")
    names = ["a", "b", "c"]
    text = {"object": json.dumps({"names": names}), "list": json.dumps(names), "broken": '{"names": [1'}[form]
    (tmp_path / "s" / "vocab.json").write_text(text)
    files = [str(p) for p in list_shards(tmp_path / "s")]
    if form == "broken":
        for read in (lambda: vocab_names(tmp_path / "s"), lambda: label_count(files)):
            with pytest.raises(DataError, match=f"{tmp_path / 's' / 'vocab.json'}: not valid JSON"):
                read()
        with pytest.raises(BenchmarkError, match="vocab.json: not valid JSON"):
            _vocab(files)
        return
    assert vocab_names(tmp_path / "s") == _vocab(files) == names and label_count(files) == 3


def test_a_split_over_a_folder_with_a_vocabulary_and_one_without_is_refused_naming_both(
    tmp_path: Path, tiny_shards: TinyShards
) -> None:
    # Labels read by name need every folder's names: the bare folder's integers name nothing.
    import shutil

    from birdjepa.data import DataError, Loader
    from birdjepa.data.shards import label_count

    for folder in ("a", "b"):
        shutil.copytree(tiny_shards.path, tmp_path / folder)
    (tmp_path / "b" / "vocab.json").unlink()
    (tmp_path / "a" / "vocab.json").write_text(json.dumps({"names": ["x", "y", "z"]}))
    files = [str(p) for f in ("a", "b") for p in list_shards(tmp_path / f)]
    line = (f"{tmp_path / 'a' / 'vocab.json'} (3 names) and {tmp_path / 'b'} (no vocab.json) name "
            "different labels: the second's labels name no class, so the split has no label space; give it "
            "a vocab.json")  # fmt: skip
    for read in (lambda: Loader(files), lambda: label_count(files)):
        with pytest.raises(DataError) as e:
            read()
        assert str(e.value) == line


def test_integer_labels_without_names_that_are_no_class_id_are_refused_naming_file_and_row(
    tmp_path: Path,
) -> None:
    # -5 read as unlabelled without a word; 2**40 sized a probe head of 71 trillion parameters ("1331200
    # GiB"), naming no label.
    from birdjepa.data import DataError
    from birdjepa.data.shards import label_count

    for bad in (-5, 2**40):
        shard = tmp_path / f"{bad}.arrow"
        table = pa.table({"ebird_code": pa.array([0, 3, bad, 1], pa.int64())})
        with pa.ipc.new_file(shard, table.schema) as f:
            f.write_table(table)
        with pytest.raises(DataError, match=rf"^{shard}: row 2: label {bad} is no class id \(0 to 1048575"):
            label_count([str(shard)])
    good = tmp_path / "good.arrow"
    with pa.ipc.new_file(good, pa.schema([("ebird_code", pa.int64())])) as f:
        f.write_table(pa.table({"ebird_code": pa.array([0, -1, None, 6], pa.int64())}))
    assert label_count([str(good)]) == 7


def test_a_held_out_split_prepared_with_the_train_split_s_vocabulary_indexes_its_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = prepare(make_src(tmp_path / "src"), tmp_path / "train")
    assert train.vocab == ["amecro", "bbbwar", "zzzfin"]
    held_out = make_src(tmp_path / "held", {"zzzfin/XC012.wav": ("wav_pcm16", 16000)})  # one class of three
    vocab = tmp_path / "train" / "vocab.json"
    main(["prepare", str(held_out), str(tmp_path / "eval"), "--vocab", str(vocab)])
    assert read_vocab(tmp_path / "eval")[1] == train.vocab
    assert table(tmp_path / "eval")["ebird_code"].to_pylist() == [2]  # zzzfin, as train indexes it (alone: 0)
    # A label the vocabulary lacks: one line naming the file, and nothing written.
    (tmp_path / "held" / "newbir").mkdir()
    (tmp_path / "held" / "newbir" / "XC050.wav").write_bytes((held_out / "zzzfin" / "XC012.wav").read_bytes())
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(held_out), str(tmp_path / "eval2"), "--vocab", str(tmp_path / "train")])
    assert e.value.code == 2 and not (tmp_path / "eval2").exists()
    err = capsys.readouterr().err
    assert f"{held_out / 'newbir' / 'XC050.wav'}: label 'newbir' is not one of the 3 of " in err, err
    # A vocabulary in its own order (the hub's ClassLabel names): "vocab names must be sorted", a
    # traceback after every file was packed, and shards left without a vocab.json.
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "vocab.json").write_text(json.dumps({"names": ["zzzfin", "amecro", "bbbwar"]}))
    shutil.rmtree(tmp_path / "held" / "newbir")
    main(["prepare", str(held_out), str(tmp_path / "eval3"), "--vocab", str(tmp_path / "hub")])
    assert read_vocab(tmp_path / "eval3")[1] == ["zzzfin", "amecro", "bbbwar"]
    assert table(tmp_path / "eval3")["ebird_code"].to_pylist() == [0]
    # A vocab.json that cannot be written: the shards are not put in place, as the error says.
    (tmp_path / "eval4" / "vocab.json").mkdir(parents=True)
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(held_out), str(tmp_path / "eval4")])
    assert e.value.code == 74 and "eval4 holds what it held before" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "eval4").iterdir()) == ["vocab.json"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"shard_mb": float("nan")}, "--shard-mb nan: must be a finite"),  # "cannot convert float NaN", later
        ({"shard_mb": float("inf")}, "--shard-mb inf: must be a finite"),  # an OverflowError's traceback
        ({"shard_mb": 1e-9}, "--shard-mb 1e-09: must be a finite"),  # "target_bytes must be positive"
        ({"prefix": ""}, "--prefix '': must be a file name's start"),  # a ValueError's traceback
        ({"prefix": "a/b"}, "--prefix 'a/b': must be a file name's start"),
        ({"prefix": ".x"}, "--prefix '.x': must be a file name's start"),  # hidden: a folder of no shards
        ({"label_column": ""}, "--label-column '': must be a name"),
        ({"workers": 0}, "--workers 0: must be >= 1"),  # one thread, without a word
    ],
)
def test_prepare_options_that_cannot_work_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict, said: str
) -> None:
    from birdjepa.data.prepare import cli

    with pytest.raises(SystemExit) as e:
        cli(make_src(tmp_path / "src"), tmp_path / "out", **options)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"birdjepa prepare: error: {said}"), err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_fifo_is_no_audio_file_and_a_name_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A FIFO named pipe.wav hung prepare; a name unpacked from an old zip was a UnicodeEncodeError's
    # traceback once a batch of files had been read.
    import os

    from birdjepa.data.prepare import cli, find_audio_files

    src = make_src(tmp_path / "src")
    listed = find_audio_files(src)
    os.mkfifo(src / "amecro" / "pipe.wav")
    assert find_audio_files(src) == listed
    os.rename(src / "amecro" / "XC001.ogg", os.fsencode(src / "amecro") + b"/caf\xe9.wav")
    with pytest.raises(SystemExit) as e:
        cli(src, tmp_path / "out")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "caf\\xe9.wav': a file name that is not UTF-8" in err, err
    assert err.count("\n") == 1


def test_a_file_over_a_row_s_bytes_is_a_file_s_problem_and_reading_is_bounded_by_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over the row's limit (an hour of 96 kHz audio was, at 512 MiB): a ValueError's traceback, no skip.
    # And 64 files were held at once, whatever their size (64 hour-long ones: ~20 GB).
    import birdjepa.data.prepare as prep

    src = make_src(tmp_path / "src")
    whole = prep.prepare(src, tmp_path / "whole")
    monkeypatch.setattr(prep, "READ_BYTES", 1)  # one file at a time: the same shards
    assert prep.prepare(src, tmp_path / "one").n_files == whole.n_files
    assert [p.read_bytes() for p in list_shards(tmp_path / "one")] == [p.read_bytes() for p in whole.shards]
    sizes = {rel: (src / rel).stat().st_size for rel in SRC_FILES}
    monkeypatch.setattr(prep, "MAX_ROW_BYTES", sorted(sizes.values())[-2])  # the largest is over it
    largest = max(sizes, key=sizes.get)
    skipped = prep.prepare(src, tmp_path / "skip", skip_bad=True).skipped
    assert skipped == [(largest, f"{sizes[largest]} bytes, over the {prep.MAX_ROW_BYTES} a shard row holds")]
    with pytest.raises(SystemExit) as e:
        prep.cli(src, tmp_path / "stop")
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{src / largest}: {sizes[largest]} bytes, over the" in err, err


def test_an_out_that_cannot_be_made_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from birdjepa.data.prepare import cli

    (tmp_path / "afile").write_text("")  # OUT under a file: NotADirectoryError's traceback
    with pytest.raises(SystemExit) as e:
        cli(make_src(tmp_path / "src"), tmp_path / "afile" / "sub")
    err = capsys.readouterr().err
    assert e.value.code == 74 and err.startswith("birdjepa prepare: error: cannot write "), err
    assert err.count("\n") == 1


def test_a_glob_of_audio_files_says_to_give_their_folder(tmp_path: Path) -> None:
    from birdjepa.data.prepare import prepare

    src = make_src(tmp_path / "src")  # it said "matches no file" of a glob that matched five
    with pytest.raises(PrepareError, match=r"src/\*/\*\.wav matches 1 files, not Parquet ones: audio files"):
        prepare(src / "*" / "*.wav", tmp_path / "out")


def test_prepare_into_its_own_source_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from birdjepa.data.prepare import cli

    src = make_src(tmp_path / "src")
    before = sorted(src.rglob("*"))
    with pytest.raises(SystemExit) as e:
        cli(src, tmp_path / "src" / ".." / "src")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "is where SRC's files are: the shards would sit among them" in err, err
    assert sorted(src.rglob("*")) == before
