"""What the synthetic sets do alike when writing: a whole set or none in the output folder (`written`),
rendering and encoding recordings in worker processes (`encoded`), and the manifest's species and
nuisance tables.
Each set plans its recordings and writes its shards and manifest itself (`birdjepa.synthetic.demo`,
`birdjepa.synthetic.scale_set`); a recording's waveform comes from `channel`, its bytes from `codecs`.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TypeVar

from birdjepa.data.shards import VOCAB_FILE, list_shards, only_writer, remove_shards
from birdjepa.outputs import unwritable
from birdjepa.synthetic.channel import Nuisance, render_recording
from birdjepa.synthetic.codecs import encode_audio
from birdjepa.synthetic.config import RecordingPlan
from birdjepa.synthetic.songs import Species

SPLITS = ("train", "eval")
MANIFEST_FILE = "manifest.json"


#: The hidden folder inside OUT a set is written into, then moved out of once whole.
PARTIAL = ".partial-"

R = TypeVar("R")


def written(out: Path, overwrite: bool, folders: Sequence[str], write: Callable[[Path], R]) -> R:
    """What ``write(folder)`` returns, having written a whole set into ``out``: into a hidden folder
    inside it first, moved into place once whole (shards, then each folder's vocab.json, the manifest
    last). A killed run (SIGTERM, kill -9) left shards without a vocabulary or manifest, which `pretrain`
    trained on without a word, and with ``overwrite`` it had removed the set that was there first: now
    it leaves a hidden folder (removed by the next run) and the set before it. ``out`` is held while it
    is written (`only_writer`): two runs into it mixed their shards, both exit 0.

    ``folders``: where a set of this kind keeps its shards (globs under ``out``). A set already there
    (the manifest, or shards in those folders) is an error without ``overwrite``, and is replaced with
    it; shards in other folders of ``out`` (another set a user keeps there) are not this command's."""
    why = unwritable(out, folder=True)  # a file there: a NotADirectoryError's traceback
    if why is not None:
        raise FileExistsError(why)
    out.mkdir(parents=True, exist_ok=True)
    with only_writer(out):
        ours = [f for pattern in folders for f in sorted(out.glob(pattern)) if f.is_dir()]
        there = next((p for p in [out / MANIFEST_FILE, *(s for f in ours for s in list_shards(f))]
                      if p.exists()), None)  # fmt: skip
        if there is not None and not overwrite:
            raise FileExistsError(f"{out} holds a data set ({there.relative_to(out)}): use --overwrite to "
                                  "replace it")  # fmt: skip
        for left in out.glob(f"{PARTIAL}*"):  # a killed run's: a live one would hold the folder
            shutil.rmtree(left)
        folder = out / f"{PARTIAL}{os.getpid()}"
        folder.mkdir()
        try:
            result = write(folder)
            for old in ours:
                remove_shards(old)
            (out / MANIFEST_FILE).unlink(missing_ok=True)
            new = [p for p in folder.rglob("*") if p.is_file()]
            for p in sorted(new, key=lambda p: (p.name == MANIFEST_FILE, p.name == VOCAB_FILE, str(p))):
                (out / p.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
                p.replace(out / p.relative_to(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return result


def make_recording(task: tuple[RecordingPlan, Sequence[Species], Nuisance]) -> bytes:
    plan, table, nuisance = task
    serial = zlib.crc32(plan.recording_id.encode())
    audio = render_recording(plan, table, nuisance)
    return encode_audio(audio, plan.sample_rate, plan.codec, ogg_serial=serial)


T = TypeVar("T")


def in_workers(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterator[R]:
    """``map(fn, items)``, in order, on up to ``workers`` spawned processes (spawn, not fork: the caller
    may hold threads, JAX's or Arrow's, that fork would copy in a locked state). A spawned worker
    imports the caller's ``__main__`` again: in a script without an ``if __name__ == "__main__":``
    guard it re-runs the script and dies, and a `multiprocessing.Pool` would wait for it forever. Then
    the rest is computed here, with one line on stderr: the same results, in one process."""
    if workers <= 1 or len(items) < 2:
        yield from map(fn, items)
        return
    done = 0
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(items)), mp_context=context) as pool:
            for result in pool.map(fn, items):
                yield result
                done += 1
    except BrokenProcessPool:
        print("birdjepa: worker processes could not start (does the script lack an `if __name__ == "
              "'__main__':` guard?); going on in this process", file=sys.stderr, flush=True)  # fmt: skip
        yield from map(fn, items[done:])


def encoded(
    tasks: Sequence[tuple[RecordingPlan, Sequence[Species], Nuisance]], workers: int
) -> Iterator[bytes]:
    return in_workers(make_recording, tasks, workers)


def species_json(species: Sequence[Species]) -> list[dict]:
    """The species table as the manifest writes it."""
    return [
        {
            "index": s.index,
            "code": s.code,
            "name": s.name,
            "band_hz": [round(s.band_hz[0], 1), round(s.band_hz[1], 1)],
            "band_group": s.band_group,
            "pattern": s.pattern,
            "syllables": [
                {"kind": syl.kind, "seconds": round(syl.seconds, 3), "rate_hz": round(syl.rate_hz, 1)}
                for syl in s.syllables
            ],
            "motif": list(s.motif),
            "gaps": [round(g, 3) for g in s.gaps],
            "pause_seconds": round(s.pause_seconds, 3),
            "harmonics": s.syllables[0].n_harmonics,
        }
        for s in species
    ]


def nuisance_json(nz: Nuisance, names: Sequence[str]) -> dict:
    def r(x: float) -> float:
        return round(float(x), 3)

    return {
        "pitch": r(nz.pitch),
        "tempo": r(nz.tempo),
        "activity": r(nz.activity),
        "noise_alpha": r(nz.noise_alpha),
        "snr_db": r(nz.snr_db),
        "band_noise": None
        if nz.band_noise is None
        else {
            "kind": nz.band_noise[0],
            "centre_hz": r(nz.band_noise[1]),
            "width_octaves": r(nz.band_noise[2]),
            "snr_db": r(nz.band_noise[3]),
        },
        "rumble_db": None if nz.rumble_db is None else r(nz.rumble_db),
        "clicks": nz.clicks,
        "background": [{"species": names[i], "db": r(db)} for i, db in nz.background],
        "highpass": {"hz": r(nz.highpass[0]), "order": nz.highpass[1]},
        "lowpass": {"hz": r(nz.lowpass[0]), "order": nz.lowpass[1]},
        "eq_db": [r(c) for c in nz.eq_db],
        "peak_dbfs": r(nz.peak_dbfs),
    }
