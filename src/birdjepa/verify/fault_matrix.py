"""The fault matrix: every injected resume fault against every resume check.

One run trains to ``resume_at`` and stops; then, for a clean resume and for each fault of
`birdjepa.verify.catalogue`, a copy of that run directory is resumed with the fault injected. The resume
checks run before the first update, so each copy stops right there (or, with ``--resume-checks warn``,
would go on); the matrix is read back from the ``resume/<check>`` metrics each copy logged for its
first resumed step. `scripts/fault_matrix.py` prints it; the tests assert it.
"""

from __future__ import annotations

import dataclasses
import shutil

from birdjepa.config import PretrainConfig
from birdjepa.outputs import scratch_folder
from birdjepa.pretrain.loop import pretrain
from birdjepa.resume.checks import CHECKS
from birdjepa.rundir.metrics_log import metrics_by_step, read_metrics
from birdjepa.verify.catalogue import EXPECTED_CHECK, FAULTS

CLEAN = "none"


@dataclasses.dataclass(frozen=True)
class Row:
    fault: str
    exit_code: int
    checks: dict[str, bool]
    """check -> passed, as logged for the first resumed step."""
    no_effect: str | None = None
    """Why the fault changes nothing at this resume point (then no check has anything to catch)."""

    @property
    def failed(self) -> list[str]:
        return [c for c in CHECKS if not self.checks[c]]


def resume_with(base: PretrainConfig, fault: str | None, resume_at: int) -> Row:
    """Copy the stopped run ``base`` and resume the copy with ``fault`` (None: a clean resume)."""
    name = fault or CLEAN
    src = base.run_dir
    cfg = dataclasses.replace(
        base,
        run=f"{base.run}-{name}",
        stop_at_step=None,
        debug=dataclasses.replace(base.debug, inject_fault=fault),
    )
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    shutil.copytree(src, cfg.run_dir)
    code = pretrain(cfg)
    logged = metrics_by_step(cfg.run_dir, everything=True).get(resume_at + 1, {})
    missing = [c for c in CHECKS if f"resume/{c}" not in logged]
    if missing:
        raise RuntimeError(f"{cfg.run_dir}: no resume/{missing[0]} logged for step {resume_at + 1}")
    injected = [e for e in read_metrics(cfg.run_dir) if e.get("event") == "fault_injected"]
    no_effect = injected[-1]["no_effect"] if injected else None
    return Row(name, code, {c: logged[f"resume/{c}"] == 1.0 for c in CHECKS}, no_effect)


def not_as_expected(rows: list[Row]) -> list[str]:
    """The clean resume if it raised a flag, and every fault that had an effect and did not trip its
    expected check. A fault with no effect here is not a miss: there was nothing to catch."""
    return [
        r.fault
        for r in rows
        if (r.failed if r.fault == CLEAN else r.no_effect is None and r.checks[EXPECTED_CHECK[r.fault]])
    ]


def run_matrix(cfg: PretrainConfig, resume_at: int, faults: tuple[str, ...] = FAULTS) -> list[Row]:
    """Train ``cfg`` to ``resume_at`` (in ``cfg.run_dir``, from scratch), then one clean resume and one
    resume per fault. Returns the rows, the clean one first."""
    scratch_folder(cfg.run_dir, "the fault matrix")  # ValueError: a user's run (--run) was removed whole
    base = dataclasses.replace(
        cfg, stop_at_step=resume_at, resume="auto", debug=dataclasses.replace(cfg.debug, inject_fault=None)
    )
    code = pretrain(base)
    if code != 0:
        raise RuntimeError(f"the base run {base.run_dir} exited {code}")
    return [resume_with(base, f, resume_at) for f in (None, *faults)]


def format_matrix(rows: list[Row]) -> str:
    """One line per fault: each check as ``ok`` or ``FAIL``, the fault's expected check starred."""
    width = max(len(r.fault) for r in rows)
    cols = [max(len(c), 5) for c in CHECKS]
    head = f"{'fault':<{width}}  exit  " + "  ".join(f"{c:>{w}}" for c, w in zip(CHECKS, cols, strict=True))
    lines = [head]
    for r in rows:
        cells = []
        for c, w in zip(CHECKS, cols, strict=True):
            mark = ("ok" if r.checks[c] else "FAIL") + ("*" if EXPECTED_CHECK.get(r.fault) == c else "")
            cells.append(f"{mark:>{w}}")
        note = f"  (no effect here: {r.no_effect})" if r.no_effect else ""
        lines.append(f"{r.fault:<{width}}  {r.exit_code:>4}  " + "  ".join(cells) + note)
    lines.append("* the check the fault must trip; FAIL = the check failed on the first resumed step")
    return "\n".join(lines)
