"""A BirdSet-shaped stand-in anyone can build offline (`birdjepa demo-data OUT --birdset`): synthetic
tasks laid out and typed like BirdSet's HF splits, so the evaluation path (multi-label test windows,
classes without train recordings) runs end to end without the real 100+ GB download.

Each task is a "site" with its own classes, drawn from one species table so that tasks overlap, and its
own recorder (`synth.soundscape.Site`). The table is the demo set's generator's (`synth.songs`) at 24
species, not the demo set's 16: with the same seed its first band groups draw the demo's note kinds,
lengths and timings in bands of their own (the bands follow the number of groups), so at the default sizes
the demo's 16 species recur here transposed, under other codes, beside 8 new ones; a demo set drawn with
more species can hold them too (at `--n-species 64`, all 24, in other bands). Its `train` split holds
focal recordings like the demo set's (one species each, `synth.channel`); its `test_5s` split holds 5 s
windows of longer soundscapes (`synth.soundscape`): every row carries the whole soundscape's bytes and
picks its window with start_time/end_time, as BirdSet does. The last task mimics BirdSet's UHH:
`unseen_classes` of its classes have no train recordings (the vocabulary still lists them).

Same config -> byte-identical files, whatever the number of workers. Output::

    OUT/<task>/train/train-00000.arrow ...      OUT/<task>/train/vocab.json
    OUT/<task>/test_5s/test_5s-00000.arrow ...  OUT/<task>/test_5s/vocab.json (the same classes)
    OUT/manifest.json    config, species table, per task: classes, site, counts, shards, test_5s label
                         statistics, every soundscape's calls and labels

Columns, typed as HF `datasets` writes BirdSet's features (`birdset_schema`): audio, filepath,
start_time, end_time, ebird_code (null in a test window without calls), ebird_code_multilabel, and
detected_events on train rows: where the focal song sounds, as an event detector would mark it
(`synth.channel.song_events`); null in test windows.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from birdjepa.cores import schedulable_cpus
from birdjepa.data.shards import AUDIO_TYPE, BATCH_ROWS, shard_name, write_vocab
from birdjepa.synthetic import writer
from birdjepa.synthetic.channel import draw_nuisance, song_events
from birdjepa.synthetic.codecs import CODECS, draw_formats
from birdjepa.synthetic.config import DemoConfig, RecordingPlan, rng_for
from birdjepa.synthetic.songs import Species, make_species
from birdjepa.synthetic.soundscape import (
    SAMPLE_RATE,
    WINDOW_SECONDS,
    SoundscapePlan,
    draw_site,
    make_soundscape,
    plan_soundscapes,
)

GENERATOR = "birdjepa.birdset_standin"
GENERATOR_VERSION = 2  # 2: detected_events on train rows
"""Bump when the output changes: the cache folder is named after it (`ensure_birdset_data`)."""
SPLITS = ("train", "test_5s")
TRAIN_CODEC_MIX = {"ogg_vorbis": 0.85, "mp3": 0.08, "flac_pcm16": 0.04, "wav_pcm16": 0.03}
"""BirdSet serves Xeno-canto's files mostly as Ogg; the others keep every decoder path in use."""
_KEY = {"tasks": 21, "train": 22, "site": 23, "test": 24, "ids": 25}
"""Entropy keys (the demo set uses 1-4, the scale set 11-14)."""


@dataclass(frozen=True)
class BirdsetConfig:
    """Size and randomness of the stand-in."""

    n_tasks: int = 3
    n_species: int = 24
    """Species in the shared table the tasks draw their classes from."""
    species_per_task: int = 12
    unseen_classes: int = 2
    """Classes of the last task (the UHH-like one) with no train recordings."""
    per_species_train: int = 24
    """More than 16, so the few-shot curve's n = 16 differs from all."""
    train_seconds: tuple[float, float] = (5.0, 20.0)
    """Train recordings are log-uniform in this range."""
    soundscapes: int = 12
    """Per task; each gives soundscape_seconds / 5 test_5s rows."""
    soundscape_seconds: float = 30.0
    label_mix: tuple[float, float, float, float] = (0.25, 0.40, 0.23, 0.12)
    """Planned share of test windows with 0, 1, 2, 3 species."""
    snr_db: tuple[float, float] = (-5.0, 20.0)
    """A call's power over the site noise's power in 1-12 kHz."""
    min_overlap: float = 0.5
    """Seconds of a call inside a window that give the window its label (or the larger part of a call)."""
    seed: int = 0
    shard_mb: float = 8.0
    """A shard is closed once its audio bytes reach this (test rows count the whole soundscape)."""

    def __post_init__(self) -> None:
        windows = self.soundscape_seconds / WINDOW_SECONDS
        bad = [msg for msg, ok in {
            "2 <= species_per_task <= n_species": 2 <= self.species_per_task <= self.n_species,
            "0 <= unseen_classes < species_per_task": 0 <= self.unseen_classes < self.species_per_task,
            "n_tasks, per_species_train, soundscapes >= 1": min(self.n_tasks, self.per_species_train,
                                                                 self.soundscapes) >= 1,
            "soundscape_seconds a multiple of 5": windows >= 1 and windows == int(windows),
            "label_mix: 4 shares >= 0": len(self.label_mix) == 4 and min(self.label_mix) >= 0,
            "snr_db = (low, high)": self.snr_db[0] <= self.snr_db[1],
        }.items() if not ok]  # fmt: skip
        if bad:
            raise ValueError(f"BirdsetConfig needs {'; '.join(bad)}")
        DemoConfig(self.n_species, 1, 0, *self.train_seconds, self.seed, self.shard_mb)  # its checks of these


DEFAULT_BIRDSET = BirdsetConfig()
"""3 tasks x 12 of 24 species: 816 train recordings (5-20 s), 36 soundscapes of 30 s (216 windows)."""
BIRDSET_SMALL = BirdsetConfig(n_tasks=2, n_species=8, species_per_task=5, unseen_classes=1,
                              per_species_train=2, train_seconds=(2.0, 4.0), soundscapes=4,
                              soundscape_seconds=15.0, shard_mb=0.5)  # fmt: skip
"""2 tasks x 5 of 8 species: 18 train recordings (2-4 s), 8 soundscapes of 15 s (24 windows): tests."""


@dataclass(frozen=True)
class Task:
    name: str
    classes: tuple[int, ...]
    """Indices into the species table, sorted (so the codes are): position = ClassLabel value."""
    seen: tuple[int, ...]
    """The ClassLabel values with train recordings (all but the UHH-like task's test-only classes)."""
    train: tuple[RecordingPlan, ...]
    """In row order; `species` indexes `seen` (no test-only class sings even behind a train recording)."""
    soundscapes: tuple[SoundscapePlan, ...]


def plan_tasks(config: BirdsetConfig) -> list[Task]:
    """Every task's classes, train recordings and soundscapes."""
    pick = rng_for(config.seed, _KEY["tasks"])
    total = config.n_tasks * config.species_per_task * config.per_species_train
    ids = iter(100000 + rng_for(config.seed, _KEY["ids"]).permutation(total))
    train_key = (config.seed, _KEY["train"])
    tasks = []
    for t in range(config.n_tasks):
        classes = tuple(sorted(int(c) for c in pick.choice(config.n_species, config.species_per_task, False)))
        n_unseen = config.unseen_classes if t == config.n_tasks - 1 else 0
        unseen = {int(c) for c in pick.choice(len(classes), n_unseen, replace=False)}
        seen = tuple(c for c in range(len(classes)) if c not in unseen)
        keys = [(j, k) for j in range(len(seen)) for k in range(config.per_species_train)]
        rng = rng_for(*train_key, t)
        codecs, rates, chans, secs = draw_formats(len(keys), TRAIN_CODEC_MIX, *config.train_seconds, rng)
        train = tuple(
            RecordingPlan("train", j, k, f"XS{next(ids)}", codecs[i], int(rates[i]), int(chans[i]),
                          float(secs[i]), (*train_key, t, classes[seen[j]], k))
            for i, (j, k) in ((int(i), keys[int(i)]) for i in rng.permutation(len(keys)))
        )  # fmt: skip
        site = draw_site(rng_for(config.seed, _KEY["site"], t))
        entropy = (config.seed, _KEY["test"], t)
        scapes = plan_soundscapes(f"SYN{t + 1}", config.soundscapes, config.soundscape_seconds,
                                  len(classes), config.label_mix, config.snr_db, site, rng_for(*entropy),
                                  entropy)  # fmt: skip
        tasks.append(Task(f"SYN{t + 1}", classes, seen, train, scapes))
    return tasks


def birdset_schema(names: Sequence[str]) -> pa.Schema:
    """The Arrow schema HF `datasets` writes for BirdSet's features, described in its "huggingface"
    metadata (the multi-label column as `Sequence`, as BirdSet's files say it and every `datasets`
    version reads; audio with decode off: its formats and rates vary, and the loader decodes it)."""
    label = {"names": list(names), "_type": "ClassLabel"}
    seconds = {"dtype": "float64", "_type": "Value"}
    features = {
        "audio": {"sampling_rate": SAMPLE_RATE, "decode": False, "_type": "Audio"},
        **{k: {"dtype": t, "_type": "Value"} for k, t in (("filepath", "string"), ("start_time", "float64"),
                                                          ("end_time", "float64"))},
        "ebird_code": label,
        "ebird_code_multilabel": {"feature": label, "_type": "Sequence"},
        "detected_events": {"feature": {"feature": seconds, "_type": "Sequence"}, "_type": "Sequence"},
    }  # fmt: skip
    fields = [("audio", AUDIO_TYPE), ("filepath", pa.string()), ("start_time", pa.float64()),
              ("end_time", pa.float64()), ("ebird_code", pa.int64()),
              ("ebird_code_multilabel", pa.list_(pa.int64())),
              ("detected_events", pa.list_(pa.list_(pa.float64())))]  # fmt: skip
    return pa.schema(fields, metadata={"huggingface": json.dumps({"info": {"features": features}})})


def write_split(folder: Path, schema: pa.Schema, groups: list[list[dict]], target_bytes: int) -> list[dict]:
    """Groups of rows (a recording's, or a soundscape's windows) into Arrow IPC file shards
    `<split>-NNNNN.arrow` in record batches of <= 64 rows. A shard closes between groups once its audio
    bytes reach `target_bytes`; it is written to a hidden `.partial` file and renamed when complete."""
    shards, rows = [], []
    for i, group in enumerate(groups):
        rows += group
        if i + 1 < len(groups) and sum(len(r["audio"]["bytes"]) for r in rows) < target_bytes:
            continue
        path = folder / shard_name(folder.name, len(shards))
        partial = path.with_name(f".{path.name}.partial")
        with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, schema) as ipc_writer:
            for b in range(0, len(rows), BATCH_ROWS):
                ipc_writer.write_batch(pa.RecordBatch.from_pylist(rows[b : b + BATCH_ROWS], schema=schema))
        partial.rename(path)
        shards.append({"file": path.name, "rows": len(rows), "bytes": path.stat().st_size})
        rows = []
    return shards


def _make(job: tuple) -> tuple[bytes, list]:
    """One job, in a worker: a focal recording's bytes and its song's events (`song_events`), or a
    soundscape's and its windows' labels."""
    if isinstance(job[0], SoundscapePlan):
        return make_soundscape(*job)
    return writer.make_recording(job), song_events(*job)


def _results(jobs: list[tuple], workers: int) -> Iterator[tuple[bytes, list]]:
    return writer.in_workers(_make, jobs, workers)


def _rows(
    path: str, data: bytes, times: list[float], labels: list[list[int]], events: list | None = None
) -> list[dict]:
    """One row per window [times[w], times[w + 1]] of a file (a focal recording: one, with its events)."""
    return [
        {"audio": {"bytes": data, "path": path}, "filepath": path, "start_time": times[w],
         "end_time": times[w + 1], "ebird_code": ls[0] if ls else None, "ebird_code_multilabel": ls,
         "detected_events": events}
        for w, ls in enumerate(labels)
    ]  # fmt: skip


def species_table(config: BirdsetConfig) -> list[Species]:
    """The species the tasks draw their classes from: the demo generator's table at ``n_species``."""
    return make_species(DemoConfig(n_species=config.n_species, seed=config.seed))


def generate_birdset(
    out: Path, config: BirdsetConfig = DEFAULT_BIRDSET, *, workers: int | None = None, overwrite: bool = False
) -> Path:
    """Writes the stand-in into `out` (see the module docstring) and returns `out`. `workers` processes
    render and encode (default: all available cores); the bytes written do not depend on it. A set
    already in `out` is replaced with `overwrite`, once this one is whole (`writer.written`); otherwise
    it is an error."""
    out = Path(out)
    folders = [f"*/{split}" for split in SPLITS]  # OUT/<task>/<split>
    writer.written(out, overwrite, folders, lambda folder: _write_birdset(folder, config, workers))
    return out


def _write_birdset(out: Path, config: BirdsetConfig, workers: int | None) -> None:
    table = species_table(config)
    tasks = plan_tasks(config)
    # soundscapes first: the longest jobs start early
    owners = [(t, p) for t in tasks for p in t.soundscapes] + [(t, p) for t in tasks for p in t.train]
    jobs = [(p, [table[t.classes[c]] for c in t.seen], draw_nuisance(p, len(t.seen)))
            if isinstance(p, RecordingPlan) else (p, [table[c] for c in t.classes], config.min_overlap)
            for t, p in owners]  # fmt: skip
    groups: dict[tuple[str, str], list[list[dict]]] = {(t.name, s): [] for t in tasks for s in SPLITS}
    labels: dict[str, list[list[int]]] = {}
    results = _results(jobs, schedulable_cpus() if workers is None else workers)
    for (task, plan), (data, made) in zip(owners, results, strict=True):
        if isinstance(plan, SoundscapePlan):
            labels[plan.soundscape_id] = made
            times = [WINDOW_SECONDS * w for w in range(len(made) + 1)]
            groups[task.name, "test_5s"].append(_rows(f"{plan.soundscape_id}.ogg", data, times, made))
        else:
            path, label = f"{plan.recording_id}.{CODECS[plan.codec][2]}", task.seen[plan.species]
            groups[task.name, "train"].append(_rows(path, data, [0.0, plan.seconds], [[label]], made))
    shards = {}
    for task in tasks:
        names = [table[c].code for c in task.classes]
        for split in SPLITS:
            folder, target = out / task.name / split, int(config.shard_mb * 2**20)
            folder.mkdir(parents=True, exist_ok=True)
            shards[task.name, split] = write_split(
                folder, birdset_schema(names), groups[task.name, split], target
            )
            write_vocab(folder, names)
    manifest = {
        "generator": GENERATOR,
        "generator_version": GENERATOR_VERSION,
        "config": dataclasses.asdict(config),
        "species": writer.species_json(table),
        "tasks": {t.name: _task_json(t, [table[c].code for c in t.classes], shards, labels) for t in tasks},
        "note": "Synthetic BirdSet stand-in (birdjepa demo-data --birdset); species and codes are invented.",
    }
    (out / writer.MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _task_json(task: Task, names: list[str], shards: dict, labels: dict[str, list[list[int]]]) -> dict:
    windows = [ls for s in task.soundscapes for ls in labels[s.soundscape_id]]
    site = task.soundscapes[0].site
    keep = ("noise_alpha", "band_noise", "rumble_db", "clicks", "highpass", "lowpass", "eq_db")
    channel = {k: v for k, v in writer.nuisance_json(site.channel, names).items() if k in keep}
    scapes = [
        {"id": s.soundscape_id, "labels": [[names[c] for c in ls] for ls in labels[s.soundscape_id]],
         "calls": [{"class": names[e.species], "start": e.start, "seconds": e.seconds,
                    "snr_db": round(e.snr_db, 2)} for e in s.events]}
        for s in task.soundscapes
    ]  # fmt: skip
    return {
        "classes": names,
        "test_only_classes": [n for c, n in enumerate(names) if c not in task.seen],
        "site": channel | {"noise_dbfs": round(site.noise_dbfs, 2), "sample_rate": SAMPLE_RATE},
        "train": {
            "recordings": len(task.train),
            "seconds": round(sum(p.seconds for p in task.train), 3),
            "per_class": dict(sorted(Counter(names[task.seen[p.species]] for p in task.train).items())),
            "codecs": dict(sorted(Counter(p.codec for p in task.train).items())),
            "shards": shards[task.name, "train"],
        },
        "test_5s": {
            "soundscapes": len(task.soundscapes),
            "segments": len(windows),
            "species_per_segment": {str(k): sum(len(ls) == k for ls in windows) for k in range(4)},
            "per_class": {n: sum(c in ls for ls in windows) for c, n in enumerate(names)},
            "shards": shards[task.name, "test_5s"],
            "soundscapes_list": scapes,
        },
    }
