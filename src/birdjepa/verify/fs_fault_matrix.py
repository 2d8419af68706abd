"""The file-system fault matrix: what a cluster's file systems do to a run, tried as a user meets it.

Each fault is produced for real, with `birdjepa pretrain` in its own process: two trainers on one run
(the same config, and another), a full disk (a tmpfs of 4.5 checkpoints, in a private mount namespace),
a torn last log line, a stale lease, a checkpoint of format 1 written by the old code, and a run started
under an old default. For each: what must happen, what did, and whether the run then finishes equal to
the straight run (`birdjepa compare`: every logged metric with ``==``; the format-1 row:
`continues_old_run`). `scripts/fs_fault_matrix.py` prints it; each row's property also has its own test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from birdjepa import exit_codes
from birdjepa.outputs import scratch_folder
from birdjepa.resume.compare import MetricDiff, compare_logged, compare_runs
from birdjepa.rundir import layout
from birdjepa.rundir.checkpoint import FORMAT_VERSION
from birdjepa.rundir.checkpoint.space import TMP_SUFFIX, folder_bytes
from birdjepa.rundir.metrics_log import TORN_SUFFIX, metrics_by_step, read_metrics
from birdjepa.train import revisions

#: A log line cut off by a node that died mid-append.
TORN = b'{"step": 31, "restart": 0, "time": 1.5, "train/lo'
#: The loader's mixing defaults before issue 16 (4 shards at a time, 1024 buffered indices).
OLD_DEFAULTS = ("--data.interleave", "4", "--data.shuffle-buffer", "1024")
STOP_AT = 30
MIN_STEPS = STOP_AT + 1 + 5 * 4
"""The fewest steps the matrix works with: each trial stops after `STOP_AT`, and the full disk fills
with 5 checkpoints (every 4 steps) after it."""
#: The old code's straight run (tests/fixtures/format1) was recorded on another machine, and XLA compiles
#: for the host CPU: there the model's numbers can differ in the last bits (measured between two CPUs: at
#: most 4.7e-7 relative, for a run of the current code from scratch as well as for the resume). What no
#: CPU changes must be equal with ==: the data stream (the batches' index CRC-32s) and the schedule.
ACROSS_CPUS_RTOL = 1e-5
EXACT_ACROSS_CPUS = ("dataloader/", "train/lr", "train/update_count", "train/accum_progress")


@dataclasses.dataclass(frozen=True)
class FsRow:
    fault: str
    expected: str
    observed: str
    ok: bool
    """Observed as expected."""
    equal: bool | None
    """The run then finished equal to the straight run (None: no straight run to compare with)."""


def birdjepa(*args: object, timeout: float = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "birdjepa.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def on_small_disk(args: Sequence[str], disk: Path, size: int, out: Path) -> subprocess.CompletedProcess:
    """``birdjepa ARGS`` with ``disk`` a tmpfs of ``size`` bytes, then the disk's content copied to ``out``
    (as a user moves a run to a larger disk). The tmpfs lives in a private mount namespace that ends
    with the command, so no mount outlives it (root, or ``unshare --map-root-user`` as a user)."""
    disk.mkdir(exist_ok=True)
    cmd = shlex.join([sys.executable, "-m", "birdjepa.cli", *args])
    copy = f"code=$?; cp -a {disk}/. {out}; exit $code"
    script = f"mount -t tmpfs -o size={size} tmpfs {disk} && {{ {cmd}; {copy}; }}"
    namespace = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    return subprocess.run([*namespace, "sh", "-c", script], capture_output=True, text=True, timeout=900)


def equal(a: Path, b: Path) -> bool:
    diffs = compare_runs(a, b)
    return bool(diffs) and all(d.max_abs == 0.0 for d in diffs)


#: What a step logs from its forward pass and its gradients, before its update moves the parameters.
BEFORE_THE_UPDATE = (
    "train/loss",
    "train/invariance",
    "train/sigreg",
    "train/embedding_rank",
    "train/projection_rank",
    "train/probe_ce",
    "train/probe_acc",
    "train/grad_norm",
)


def continues_old_run(run: Path, old: Path) -> list[MetricDiff]:
    """The metrics the old code's run ``old`` logged in which ``run``, resumed by this code from the old
    code's checkpoint, departs from it: any difference in the data stream or the schedule, more than
    ACROSS_CPUS_RTOL relative in the model's numbers. Where the resume crossed a declared revision of
    the step that moves the training (`birdjepa.train.revisions`: its ``step_revised`` event), this
    code's updates are its own: the model's numbers are held up to the first resumed step's forward
    pass and gradients (the restored state's), the data stream and the schedule to the end. A metric a
    crossed revision redefines is not compared."""
    ours, theirs = metrics_by_step(run), metrics_by_step(old)
    crossed = [e for e in read_metrics(run) if e.get("event") == "step_revised"]
    revised = [r for e in crossed for r in revisions.between(*e["revision"])]
    redefined = revisions.redefined(revised)
    names = {k for logged in theirs.values() for k in logged if not revisions.is_redefined(k, redefined)}
    exact = {n for n in names if n.startswith(EXACT_ACROSS_CPUS)}
    if any(r.training for r in revised):
        first = crossed[0]["step"]
        before = [{s: m for s, m in log.items() if s < first} for log in (ours, theirs)]
        at = [{first: log[first]} for log in (ours, theirs)]
        diffs = [*compare_logged(ours, theirs, exact), *compare_logged(*before, names - exact),
                 *compare_logged(*at, names & set(BEFORE_THE_UPDATE))]  # fmt: skip
    else:
        diffs = compare_logged(ours, theirs, names)
    allowed = {d.name: 0.0 if d.name.startswith(EXACT_ACROSS_CPUS) else ACROSS_CPUS_RTOL for d in diffs}
    return [d for d in diffs if d.max_rel > allowed[d.name]]


def said(done: subprocess.CompletedProcess, start: str) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith(start)]


class Matrix:
    """The runs of one matrix under ``runs``: ``flags`` make every run (and the straight one) the same."""

    def __init__(self, runs: Path, flags: Sequence[str], format1: Path | None) -> None:
        self.runs, self.flags, self.format1 = runs, [*flags, "--log.runs-dir", str(runs)], format1

    def pretrain(self, run: str, *extra: object, **kw: float) -> subprocess.CompletedProcess:
        return birdjepa("pretrain", "--run", run, *self.flags, *extra, **kw)

    def resume(self, run: str, runs: Path | None = None) -> subprocess.CompletedProcess:
        """A bare restart (a requeue): the run's options come from its checkpoint."""
        return birdjepa("pretrain", "--run", run, "--log.runs-dir", runs or self.runs)

    def rows(self) -> list[FsRow]:
        scratch_folder(self.runs, "the file-system fault matrix")  # ValueError: a folder of the user's
        for name, extra in (("straight", ()), ("straight-old-defaults", OLD_DEFAULTS)):
            done = self.pretrain(name, *extra)
            if done.returncode != 0:
                why = (done.stdout + done.stderr)[-2000:]  # a refused option says so on stderr: it was blank
                raise RuntimeError(f"the straight run {name} exited {done.returncode}: {why}")
        faults: list[tuple[str, Callable[[], FsRow]]] = [
            ("two writers, same config", lambda: self.two_writers("same config", ())),
            (
                "two writers, another config",
                lambda: self.two_writers("another config", ("--optim.lr", "0.003")),
            ),
            ("full disk", self.full_disk),
            ("torn last log line", self.torn_log),
            ("stale lease", self.stale_lease),
            ("format-1 checkpoint", self.format_1),
            ("a run started under old defaults", self.old_default),
        ]
        return [_tried(name, fault) for name, fault in faults]

    def two_writers(self, how: str, extra: Sequence[str]) -> FsRow:
        run = f"twice-{how.split()[0]}"
        cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", run, *self.flags]
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while (
            not layout.lease_file(self.runs / run).exists()
            and first.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        second = birdjepa("pretrain", "--run", run, *self.flags, *extra)
        first_code = first.wait(timeout=900)
        line = (said(second, "ERROR") or ["(no ERROR line)"])[0]
        logged = [(r["step"], r["restart"]) for r in read_metrics(self.runs / run) if "train/loss" in r]
        once = len(logged) == len(set(logged)) and {r for _, r in logged} == {0}
        ok = second.returncode == exit_codes.USAGE and f"held by pid {first.pid}" in line and first_code == 0
        return FsRow(
            f"two writers, {how}",
            "the second: one line naming the holder, exit 2, nothing touched; the first finishes",
            f"second exit {second.returncode}: {line[:70]}...; first exit {first_code}; "
            f"{'each step logged once' if once else 'steps logged twice'}",
            ok and once,
            equal(self.runs / "straight", self.runs / run),
        )

    def full_disk(self) -> FsRow:
        disk, moved = self.runs / "disk", self.runs / "moved"
        moved.mkdir()
        size = int(4.5 * folder_bytes(next(layout.checkpoints(self.runs / "straight").iterdir())))
        args = ["pretrain", "--run", "full", *self.flags, "--log.runs-dir", str(disk), "--ckpt-keep", "10"]
        done = on_small_disk(args, disk, size, moved)
        errors, warnings = said(done, "ERROR"), said(done, "WARNING")
        left = [p.name for p in (moved / "full").rglob(f"*{TMP_SUFFIX}")]
        clean = "Traceback" not in done.stdout + done.stderr and not left
        resumed = self.resume("full", moved)
        ok = done.returncode == exit_codes.IOERR and len(errors) == 1 and len(warnings) == 1 and clean
        return FsRow(
            "full disk (tmpfs of 4.5 checkpoints)",
            "a WARNING before, then one ERROR line, exit 74; no traceback, no tmp folder; moved, it resumes",
            f"exit {done.returncode}: {errors[0][:70] if errors else '(no ERROR line)'}...; {len(warnings)} "
            f"WARNING; {'clean' if clean else f'left {left}'}; moved: exit {resumed.returncode}",
            ok and resumed.returncode == 0,
            equal(self.runs / "straight", moved / "full"),
        )

    def _stopped(self, run: str, *extra: object) -> Path:
        done = self.pretrain(run, "--stop-at-step", STOP_AT, *extra)
        if done.returncode != 0:
            raise RuntimeError(f"{run} exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
        return self.runs / run

    def torn_log(self) -> FsRow:
        run = self._stopped("torn")
        with layout.metrics_file(run).open("ab") as f:
            f.write(TORN)
        done = self.resume("torn")
        events = [r for r in read_metrics(run) if r.get("event") == "torn_log"]
        moved = (
            layout.metrics_file(run).with_name(layout.METRICS_FILE + TORN_SUFFIX).read_bytes() == TORN + b"\n"
        )
        return FsRow(
            "torn last log line",
            "cut off into metrics.jsonl.torn with a WARNING and an event; appends start on a new line",
            f"exit {done.returncode}; {len(said(done, 'WARNING'))} WARNING; {len(events)} torn_log event; "
            f"{'moved' if moved else 'not moved'}",
            done.returncode == 0 and moved and len(events) == 1,
            equal(self.runs / "straight", run),
        )

    def stale_lease(self) -> FsRow:
        run = self._stopped("stale")
        gone = subprocess.Popen(["true"])
        gone.wait()
        lease = {"host": socket.gethostname(), "pid": gone.pid, "job": None, "started": time.time() - 600,
                 "token": "0123456789abcdef", "heartbeat": time.time() - 1}  # fmt: skip
        layout.lease_file(run).write_text(json.dumps(lease))
        done = self.resume("stale")
        events = [r for r in read_metrics(run) if r.get("event") == "lease_taken_over"]
        took = any("took over a stale lease" in line for line in said(done, "WARNING"))
        return FsRow(
            "stale lease (holder's pid gone)",
            "taken over with a WARNING and a lease_taken_over event",
            f"exit {done.returncode}; {'WARNING' if took else 'no WARNING'}; {len(events)} event",
            done.returncode == 0 and took and len(events) == 1,
            equal(self.runs / "straight", run),
        )

    def format_1(self) -> FsRow:
        if self.format1 is None:
            return FsRow(
                "format-1 checkpoint", "read, verified by its norms", "no fixture given", False, None
            )
        run = self.runs / "format1"
        shutil.copytree(self.format1 / "run", run)
        done = self.resume("format1")
        line = (said(done, "CKPT_FORMAT") or ["(no CKPT_FORMAT line)"])[0]
        newest = max(layout.checkpoint_steps(run))
        meta = json.loads((layout.checkpoint(run, newest) / "meta" / "metadata").read_text())
        return FsRow(
            "format-1 checkpoint (old code)",
            f"read and verified by its norms, said in one line; the next save writes format {FORMAT_VERSION}",
            f"exit {done.returncode}: {line[:70]}...; newest checkpoint {newest} of format "
            f"{meta.get('checkpoint_format')}",
            done.returncode == 0
            and "CKPT_FORMAT" in line
            and meta.get("checkpoint_format") == FORMAT_VERSION,
            not continues_old_run(run, self.format1 / "straight"),  # ends as the old code ended it
        )

    def old_default(self) -> FsRow:
        run = self._stopped("old-default", *OLD_DEFAULTS)
        done = self.resume("old-default")
        kept = "data.shuffle_buffer=1024 (default now" in done.stdout
        failed = [
            line
            for line in done.stdout.splitlines()
            if line.startswith("RESUME_CHECK") and "ok=False" in line
        ]
        return FsRow(
            "a run started under old defaults",
            "a bare resume keeps the run's options (said in one line); every resume check passes",
            f"exit {done.returncode}; {'kept' if kept else 'not kept'}; {len(failed)} resume check failed",
            done.returncode == 0 and kept and not failed,
            equal(self.runs / "straight-old-defaults", run),
        )


def _tried(name: str, fault: Callable[[], FsRow]) -> FsRow:
    """The row of one fault; a fault whose trial itself broke is a row, named ``name``, that says how (not
    a traceback that hides the other rows)."""
    try:
        return fault()
    except Exception as e:  # noqa: BLE001
        return FsRow(name, "-", f"the trial raised {type(e).__name__}: {e}", False, None)


def format_rows(rows: list[FsRow]) -> str:
    """A Markdown table: fault, expected, observed, as expected, equal to the straight run."""
    lines = ["| fault | expected | observed | as expected | then equal to the straight run |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        eq = "n/a" if r.equal is None else ("yes" if r.equal else "NO")
        lines.append(f"| {r.fault} | {r.expected} | {r.observed} | {'yes' if r.ok else 'NO'} | {eq} |")
    return "\n".join(lines)


def misses(rows: list[FsRow]) -> list[str]:
    return [r.fault for r in rows if not r.ok or r.equal is False]
