"""Retention and fallback, the checkpoints' policy over one run's steps (a mixin of `Checkpointer`).

Retention (``keep``) deletes the oldest checkpoints beyond the newest ``keep``, but never the newest one
that verifies (read back from disk, once). A restore falls back: a checkpoint that does not verify (a
changed byte, a truncated or missing file, a missing meta) raises `IntegrityError`; `restore_latest`
then takes the newest one that does, moving each damaged one aside into ``checkpoints.damaged/`` so it
is never picked again (`fallbacks` says which and why). A target of another structure or an older
format raises plain `CheckpointError`: the checkpoint is fine, the run asking for it is not, so it is
left where it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from birdjepa.rundir.checkpoint.format import CheckpointError, IntegrityError, NoValidCheckpointError
from birdjepa.rundir.layout import DAMAGED_DIR


class RetentionAndFallback:
    """What `Checkpointer` does across steps: keep, verify, fall back. It reads the store through what
    `Checkpointer` defines: `all_steps`, `restore`, `_committed`, `checked_meta`, `_read_verified`
    and the Orbax manager `_mngr`."""

    _mngr: Any
    directory: Path
    keep: int | None
    fallbacks: list[dict[str, Any]]
    _verified: set[int]
    _kept_against_policy: set[int]
    warnings: list[str]
    _saved: bool
    write_failed: bool

    def verify(self, step: int) -> bool:
        """Whether checkpoint ``step`` reads back from disk as it was saved (every hash and norm); once
        per step and process."""
        if step not in self._verified:
            try:
                meta = self.checked_meta(step)
                self._read_verified(step, meta)
            except CheckpointError:  # damaged, or of another format
                return False
            self._verified.add(step)
        return True

    def _retain(self) -> None:
        """Delete checkpoints older than the newest ``keep``, except the newest one that verifies; nothing
        once a save failed (the run's last save is not on disk: what is, stays)."""
        if self.keep is None or not self._saved or self.write_failed:
            return
        steps = self._committed()
        if len(steps) <= self.keep:
            return
        keeper = next((s for s in reversed(steps) if self.verify(s)), None)
        for s in steps[: -self.keep]:
            if s != keeper and s not in self._kept_against_policy:
                try:
                    self._mngr.delete(s)
                except OSError as e:  # another user's files, an admin's chmod: each save stopped the run
                    self._kept_against_policy.add(s)
                    where = self.directory / str(s)  # rmtree's names are relative to the folder it was in
                    said = (f"checkpoint {s} could not be removed ({e.strerror}, in {where}), which "
                            f"--ckpt-keep {self.keep} no longer keeps: the run trains on; remove it "
                            "by hand")  # fmt: skip
                    print(f"WARNING {said}", flush=True)
                    self.warnings.append(said)

    def restore_latest(self, target: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """``(step, state, meta)`` of the newest checkpoint that verifies, or None if there is none.
        Each newer one that does not verify is moved aside (see the module doc) and listed in
        `fallbacks`, with a WARNING. Raises `NoValidCheckpointError` when checkpoints exist and none
        verifies."""
        for step in reversed(self.all_steps()):
            try:
                state, meta = self.restore(step, target)
            except IntegrityError as e:
                moved = self._move_aside(step)
                self.fallbacks.append({"checkpoint": step, "reason": str(e), "moved_to": str(moved)})
                print(f"WARNING checkpoint {step} is damaged and was moved to {moved}: {e}", flush=True)
                continue
            return step, state, meta
        if self.fallbacks:
            raise NoValidCheckpointError(
                f"no checkpoint in {self.directory} verifies: {len(self.fallbacks)} damaged ones were moved "
                f"to {self.directory.parent / DAMAGED_DIR} (the newest: {self.fallbacks[0]['reason']}); the "
                "next start begins the run over at step 0: to resume, put a good copy of one (a backup) "
                f"in {self.directory} first"
            )
        return None

    def _move_aside(self, step: int) -> Path:
        """Move damaged checkpoint ``step`` out of the run's checkpoints (never listed again)."""
        aside = self.directory.parent / DAMAGED_DIR
        aside.mkdir(exist_ok=True)
        dest = aside / str(step)
        n = 1
        while dest.exists():
            dest, n = aside / f"{step}-{n}", n + 1
        shutil.move(str(self.directory / str(step)), str(dest))
        self._mngr.reload()
        return dest
