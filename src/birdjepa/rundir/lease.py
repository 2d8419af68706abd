"""One writer per run: a lease file in the run directory, renewed by a heartbeat.

``flock`` is not honoured on every file system clusters use (NFS without lockd, some Lustre/GPFS
mounts), so the lock is a file: ``<run_dir>/lease.json`` naming the holder (host, pid, Slurm job id,
start time, a random token) and its last heartbeat. It is created whole, written aside and hard-linked
into place (``link`` fails if the name exists: atomic on local disks and NFS), renewed every
`HEARTBEAT_S` seconds by a daemon thread (write aside, then rename: readers never see half a lease),
and removed on release. A lease is stale when its holder is a process of this host that no longer
exists, or when its heartbeat is older than `STALE_AFTER_S` by this host's clock (or as far ahead of it);
another host's, stamped by another clock, only if it also stays the same while watched for `WATCH_S`
by this process's own clock. A stale lease is taken over by the one
taker that creates the takeover marker first, after checking the lease is still the stale one. The
heartbeat renews under the same marker: a holder presumed dead that wakes never writes its lease back
over the taker's, and the trainer asks `Lease.check` before it writes into the run: one that wakes
(a suspended job, a node cut off and back) stops instead of writing beside the taker.

Read-only commands (`compare`, `analyze`, `trace`, `bisect`) take no lease and work on a live run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from birdjepa.rundir.layout import LEASE_FILE

#: Seconds a Slurm-started trainer waits for a live holder to end (the job script sets it to the
#: preemption grace: a requeued job may start while its predecessor is still saving).
LEASE_WAIT_ENV = "BIRDJEPA_LEASE_WAIT_S"
HEARTBEAT_S = 15.0
#: Four missed heartbeats: the holder is gone (or its node is cut off and will not write again).
STALE_AFTER_S = 4 * HEARTBEAT_S
#: A takeover marker this process has seen unchanged this long was left by a taker that died mid-takeover.
TAKEOVER_MARKER_S = 30.0
#: Another host stamps its heartbeat with its own clock, and two nodes' clocks may disagree by minutes: a
#: node 10 min ahead took a live run over (two writers, then the healthy trainer stopped), and a dead
#: holder's heartbeat from a clock ahead held the run until the clocks caught up. Such a lease is stale
#: only once its heartbeat has also stayed the same while this process watched it, this long, by its own
#: clock: three heartbeats.
WATCH_S = 3 * HEARTBEAT_S


class LeaseHeld(RuntimeError):
    """Another live process holds the run."""

    def __init__(self, run_dir: Path, holder: dict[str, Any], copied: bool = False) -> None:
        """``copied``: the lease names another folder (device, inode) on this host than ``run_dir``."""
        self.holder = holder
        # Not taken over for it: the same folder through another mount (FUSE, NFS mounted twice) has
        # another device, or another inode, and a live trainer there would have a second writer.
        copy = (f" (its lease names another folder than this one: copied with it, as cp -r of a live run "
                f"does, and stale {STALE_AFTER_S:.0f} s after the copy; or this folder through another mount)"
                if copied else "")  # fmt: skip
        super().__init__(f"{held_by(run_dir, holder)} ({run_dir / LEASE_FILE}); nothing was touched{copy}")


class LeaseLost(RuntimeError):
    """This process was presumed dead and its run taken over (or its lease removed): it must not write."""

    def __init__(self, run_dir: Path, taker: dict[str, Any] | None, silent_s: float | None) -> None:
        """``silent_s`` None: in another process of a multi-process run, which holds no lease of its own."""
        self.taker = taker
        if silent_s is None:
            super().__init__(f"process 0 of this trainer's group lost the lease of run {run_dir.name} "
                             f"({run_dir / LEASE_FILE}); every process stops without writing")  # fmt: skip
            return
        now = held_by(run_dir, taker) if taker else f"run {run_dir.name} has no lease"
        super().__init__(f"this trainer went {silent_s:.0f} s without renewing its lease (suspended, or cut "
                         f"off), and {now} ({run_dir / LEASE_FILE}); it stops without writing")  # fmt: skip


class RunDirGone(LeaseLost):
    """The run directory was moved or removed while this process held it: its next save recreated the
    old path (a run split in two, said to be a lease not renewed), or the heartbeat died in a traceback."""

    def __init__(self, run_dir: Path, what: str) -> None:
        self.taker = None
        said = f"the run directory {run_dir} {what} while this trainer ran; it stops without writing"
        RuntimeError.__init__(self, f"{said} (the checkpoints saved are where the folder went)")


def _identity(folder: Path) -> tuple[int, int]:
    st = os.stat(folder)
    return st.st_dev, st.st_ino


class LeaseUnwritable(RuntimeError):
    """The run directory, or the lease in it, cannot be written (a read-only folder, a full disk): nothing
    was touched."""


def held_by(run_dir: Path, holder: dict[str, Any]) -> str:
    """``run r1 is held by pid 4242 on node17, job 912345, since 2026-12-06 10:41:07``, and, for a holder
    renewing its lease by a clock that disagrees with this host's, by how much."""
    job = f", job {holder['job']}" if holder.get("job") else ""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    pid, host = holder.get("pid"), holder.get("host")
    apart = ""
    if (skew := holder.get("clock_skew_s")) is not None:
        way = "behind" if skew < 0 else "ahead of"
        apart = f" (it renews its lease, by a clock {abs(skew):.0f} s {way} this host's)"
    return f"run {run_dir.name} is held by pid {pid} on {host}{job}, since {since}{apart}"


def _me() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job": os.environ.get("SLURM_JOB_ID"),
        "started": time.time(),
        "token": secrets.token_hex(8),
    }


def _read(path: Path) -> dict[str, Any] | None:
    """The lease at ``path``: None where there is none; a damaged one (every writer writes aside and
    renames or links) as stale. A link to nowhere read as none, and JSON that is no lease (``null``) too:
    the trainer took it for released, again and again, at full CPU and deaf to SIGTERM, for ever."""
    damaged = {"heartbeat": 0.0, "damaged": True}
    try:
        lease = json.loads(path.read_text())
    except FileNotFoundError:
        return damaged if os.path.lexists(path) else None
    except (ValueError, OSError):
        return damaged
    heartbeat = lease.get("heartbeat", 0.0) if isinstance(lease, dict) else None
    if not isinstance(heartbeat, (int, float)) or isinstance(heartbeat, bool):  # a list, a text heartbeat
        return damaged
    return lease


def _write(path: Path, lease: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{lease['token']}")
    tmp.write_text(json.dumps(lease))
    os.replace(tmp, path)


def _create(path: Path, lease: dict[str, Any]) -> bool:
    """Creates the lease whole or not at all: written aside, then hard-linked into place (``link`` fails
    if the name exists, atomically, on local disks and NFS). A file created empty and written after
    would let a racer read it half-written and take it for stale."""
    tmp = path.with_name(f".{path.name}.{lease['token']}")
    tmp.write_text(json.dumps(lease))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Whether this process may change the lease now: the one that creates ``lease.json.takeover``
    exclusively (``O_EXCL``: atomic on local disks and NFS) until it leaves. Takers and the holder's
    heartbeat both read, check and write the lease under it, so neither replaces what the other just
    wrote. A marker left by a process that died is removed after `TAKEOVER_MARKER_S`."""
    marker = path.with_name(f"{path.name}.takeover")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        # Timed by this process's clock: its time against the file system's stamp (another clock) left a
        # trainer 3 min behind stalled for the difference, deaf to SIGTERM, and one ahead removed a marker
        # in use.
        with contextlib.suppress(FileNotFoundError):
            st = marker.stat()
            seen = (st.st_ino, st.st_mtime_ns)
            first = _markers_seen.get(str(marker))
            if first is None or first[0] != seen:
                _markers_seen[str(marker)] = (seen, time.monotonic())
            elif time.monotonic() - first[1] > TAKEOVER_MARKER_S:
                marker.unlink(missing_ok=True)
        yield False
        return
    try:
        yield True
    finally:
        marker.unlink(missing_ok=True)


_markers_seen: dict[str, tuple[tuple[int, int], float]] = {}
"""Takeover markers this process found in place: their identity, and when (its monotonic clock) it first
saw them so."""


def _take_over(path: Path, holder: dict[str, Any], lease: dict[str, Any]) -> bool:
    """Replaces the stale ``holder`` by ``lease``, if no other process is changing the lease and it is
    still that holder's: two takers never both replace what each read as stale (the second would replace
    the first's fresh lease), and a holder's heartbeat never writes its lease back over a taker's."""
    with _exclusive(path) as mine:
        if not mine:
            return False
        current = _read(path)
        if current is None or current.get("token") != holder.get("token"):
            return False  # released or taken meanwhile
        _write(path, lease)
        return True


def stale(holder: dict[str, Any], now: float | None = None) -> str | None:
    """Why ``holder`` no longer holds the run (None: it does)."""
    now = time.time() if now is None else now
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return f"pid {holder['pid']} no longer runs on this host"
        except PermissionError:
            pass  # another user's live process
    age = now - float(holder.get("heartbeat", 0.0))
    if age > STALE_AFTER_S:
        return f"no heartbeat for {age:.0f} s"
    # Another host's clock ahead of this one's: never stale by its age (this host's own clock stepped back
    # under a live holder of this host says nothing of it).
    if age < -STALE_AFTER_S and holder.get("host") != socket.gethostname():
        return f"a heartbeat {-age:.0f} s ahead of this host's clock"
    return None


def _watched(path: Path, holder: dict[str, Any], poll_s: float) -> dict[str, Any] | None:
    """The lease at ``path`` once it changed while this process watched it, for up to `WATCH_S` of its own
    clock (its holder is alive, whatever its clock says: returned with ``clock_skew_s``, how far its
    heartbeat is from this host's clock); None: it stayed ``holder``'s, unchanged (its holder is gone), or
    went (released)."""
    end = time.monotonic() + WATCH_S
    while time.monotonic() < end:
        time.sleep(min(poll_s, max(end - time.monotonic(), 0.0)))
        now = _read(path)
        if now is None or now.get("token") != holder.get("token"):
            return None  # released or taken: the caller looks again
        if now.get("heartbeat") != holder.get("heartbeat"):
            return {**now, "clock_skew_s": float(now["heartbeat"]) - time.time()}
    return None


@dataclasses.dataclass
class Lease:
    """The run directory held by this process until `release`."""

    path: Path
    holder: dict[str, Any]
    took_over: dict[str, Any] | None = None
    """The stale holder this lease replaced, and why it was stale (None: the run was free)."""

    def __post_init__(self) -> None:
        self.folder = _identity(self.path.parent)  # a folder put at its name later is another run's
        self.renewed = time.time()  # the heartbeat it was created with
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _renew(self) -> bool | None:
        """A fresh heartbeat if the lease is still this process's: True; False: it is not (taken over, or
        removed); None: a taker is changing it now."""
        with _exclusive(self.path) as mine:
            if not mine:
                return None
            current = _read(self.path)
            if current is None or current.get("token") != self.holder["token"]:
                self.lost = True
                return False
            now = time.time()
            _write(self.path, {**self.holder, "heartbeat": now})
            self.renewed = now
            return True

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if self._renew() is False:
                    return  # taken over (this process was presumed dead): stop renewing
            except OSError:  # the folder moved or removed, a full disk: `check` says it, before a write
                continue

    def check(self) -> None:
        """Raises `LeaseLost` unless this process still holds the run; before each write into it. While
        heartbeats come on time it reads a clock: renewed less than half `STALE_AFTER_S` ago, no taker
        can have found the lease stale. After a longer silence (the process was stopped: a suspended
        job, a paused machine) it renews the lease now, under the marker, or finds it taken."""
        self._in_place()
        silent = time.time() - self.renewed
        if not self.lost and silent < STALE_AFTER_S / 2:
            return
        while not self.lost:
            if self._renew():
                return
            time.sleep(0.05)  # a taker holds the marker: its outcome decides
        raise self._lost(_read(self.path), silent)

    def still_held(self) -> None:
        """Raises as `check` does unless the lease still names this process, by reads alone (safe from
        any thread): what a save's commit asks before it renames its folder into the run (`Checkpointer`'s
        ``before_commit``). A stopped process woken before any taker came still holds it."""
        self._in_place()
        current = _read(self.path)
        if current is None or current.get("token") != self.holder["token"]:
            raise self._lost(current, time.time() - self.renewed)

    def _in_place(self) -> None:
        """Raises `RunDirGone` where the run's folder was moved or removed, or another put at its name."""
        # A stat a step (the save after a move wrote into a new folder at the old name), of the inode: an
        # NFS remount gives the same folder another device.
        try:
            moved = _identity(self.path.parent)[1] != self.folder[1]
        except (FileNotFoundError, NotADirectoryError):
            raise RunDirGone(self.path.parent, "was moved or removed") from None
        except OSError as e:  # NFS: a folder removed on another client is ESTALE; EIO may pass
            if e.errno == errno.ESTALE:
                raise RunDirGone(self.path.parent, "was moved or removed") from None
            moved = False  # looked at again after the next step
        if moved:
            raise RunDirGone(self.path.parent, "was moved or removed, and another folder put at its name")

    def _lost(self, taker: dict[str, Any] | None, silent: float) -> LeaseLost:
        """What a lease no longer this process's says: removed with no taker (none removes it) while its
        heartbeats came on time, or taken over (or removed after a silence a taker may have ended)."""
        if taker is None and silent < STALE_AFTER_S / 2:
            return RunDirGone(self.path.parent, "lost its lease (the folder replaced, or the file removed)")
        return LeaseLost(self.path.parent, taker, silent)

    def release(self) -> None:
        self._stop.set()
        current = _read(self.path)
        if current is not None and current.get("token") == self.holder["token"]:
            self.path.unlink(missing_ok=True)


def acquire(run_dir: Path, *, wait_s: float = 0.0, poll_s: float = 1.0) -> Lease:
    """Hold ``run_dir`` (created if needed): at once, after up to ``wait_s`` seconds for a live holder to
    end, or by taking over a stale lease (printed as a WARNING). Raises `LeaseHeld`, or `LeaseUnwritable`
    where the run directory or its lease cannot be written."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        # A symlink to a folder gone (a node's scratch) or a loop: "File exists ... make it writable".
        looped = run_dir.is_symlink() or e.errno == errno.ELOOP
        link = " (a symbolic link to nowhere, or a loop)" if looped else ""
        if not looped and run_dir.exists() and not run_dir.is_dir():  # "... make it writable" of a file
            link = " (a file is there, not a folder)"
        raise LeaseUnwritable(f"cannot create the run directory {run_dir}{link}: {e.strerror or e}") from None
    try:
        return _hold(run_dir, run_dir / LEASE_FILE, wait_s, poll_s)
    except OSError as e:  # the lease and the marker are this process's first writes into the run
        raise LeaseUnwritable(f"cannot write the lease {run_dir / LEASE_FILE}: {e.strerror or e}") from None


def _hold(run_dir: Path, path: Path, wait_s: float, poll_s: float) -> Lease:
    me = {**_me(), "folder": list(_identity(run_dir))}
    deadline = time.monotonic() + wait_s
    said = False  # that it waits, once
    while True:
        mine = {**me, "heartbeat": time.time()}
        if _create(path, mine):
            return Lease(path, me)
        holder = _read(path)
        if holder is None:
            continue  # released between the two calls
        why = stale(holder)
        if why is not None and not holder.get("damaged") and holder.get("host") != socket.gethostname():
            # Stamped by another host's clock: stale only if it also stays the same while watched.
            alive = _watched(path, holder, poll_s)
            if alive is not None:
                why, holder = None, alive
            elif _read(path) != holder:
                continue  # released or taken meanwhile
        if why is not None:
            if _take_over(path, holder, mine):
                # A damaged one said "a stale lease of pid None on None (no heartbeat for 1796529485 s)".
                pid, host = holder.get("pid"), holder.get("host")
                whose = ("an unreadable lease (not a lease's JSON)" if holder.get("damaged") else
                         f"a stale lease of pid {pid} on {host} ({why})")  # fmt: skip
                print(f"WARNING {path}: took over {whose}", flush=True)
                return Lease(path, me, {**holder, "why": why})
            time.sleep(0.05)  # another taker is at it: look again
            continue
        if time.monotonic() >= deadline:  # `cp -r` of a live run copies its lease: said, not taken over
            copied = holder.get("host") == socket.gethostname() and holder.get("folder") not in (
                None,
                me["folder"],
            )
            raise LeaseHeld(run_dir, holder, copied) from None
        if not said:
            said = True
            print(f"{held_by(run_dir, holder)}: waiting up to {wait_s:.0f} s for it to end", flush=True)
        time.sleep(poll_s)
