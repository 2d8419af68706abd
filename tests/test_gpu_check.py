"""`scripts/gpu_check.py` runs end to end wherever the suite runs (a CPU here), so it cannot rot before a
GPU runs it: every section runs, on one kind of device every check holds, and the prebuild a GPU starts
with compiles what the timed sections then load. (Its reference section needs the reference's checkout:
`scripts/bench_reference.py`'s measurement, rehearsed by hand.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from birdjepa.train.compile_cache import without_jax_settings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.mark.slow  # ~3 min in .ci/run beside another worker: a verify-resume, a trace, 10 more processes
def test_gpu_check_runs_every_section_and_every_check_holds(tmp_path: Path) -> None:
    # A compilation cache of its own, empty (not the suite's): what the step and conds sections load, the
    # prebuild compiled, as on a GPU, where the prebuild is on by default.
    env = without_jax_settings(os.environ) | {"BIRDJEPA_COMPILE_CACHE": str(tmp_path / "xla")}
    out, runs = tmp_path / "table.json", tmp_path / "runs"
    # Not resume-cached: the resume section's code with a cache folder (58 s here), whose exact resume
    # from a warm cache tests/test_compile_cache.py proves at the default level.
    every = ["resume", "noise", "step", "conds", "loader", "requeue"]
    cmd = [sys.executable, str(SCRIPT), "--quick", "--prebuild", "--budget-s", "3000", "--json", str(out),
           "--runs", str(runs), "--sections", *every]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = json.loads(out.read_text())
    rows = table["rows"]
    assert table["complete"] is True
    assert [r[0] for r in rows] == ["prebuild", "resume", "noise floor", "matmul peak", "step",
                                    "step parts", "in place", "conds", "in place steps", "loader",
                                    "data wait", "loop parts", "loop parts", "requeue"]  # fmt: skip
    verdicts = {(section, verdict) for section, _, _, verdict in rows}
    assert verdicts == {("prebuild", "measured"), ("resume", "ok"), ("noise floor", "ok"),
                        ("matmul peak", "measured"), ("step", "measured"), ("step parts", "measured"),
                        ("loader", "measured"), ("data wait", "measured"), ("loop parts", "measured"),
                        ("requeue", "measured"), ("conds", "measured"), ("in place", "measured"),
                        ("in place steps", "measured")}  # fmt: skip
    by_name = {r[0]: r for r in rows}
    # The step's program and the conds section's other: each timed process loaded its step.
    assert re.fullmatch(r"3 programs, \d+ processes at a time", by_name["prebuild"][1]), by_name["prebuild"]
    step = by_name["step"][2]
    assert re.search(r"loaded in \d+ s \(compiled by the prebuild in \d+ s\)$", step), step
    # On a CPU the harness's copy insertion copies none of the donated state, XLA's default copies it.
    in_place = by_name["in place"][2]
    assert re.fullmatch(r"copies of the given state 0 against [1-9]\d*; XLA plan \d+ against \d+ MiB",
                        in_place), in_place  # fmt: skip
    # The step without its record is another program: timed, its parameters compared, equal or not.
    conds = by_name["conds"][2]
    assert conds.endswith("; every step loaded from the prebuild"), conds
    default, unrecorded = conds.removesuffix("; every step loaded from the prebuild").split("; ")
    assert re.fullmatch(r"[\d.]+ ms a step", default), default
    assert re.fullmatch(r"[\d.]+ ms \([\d.]+x, parameters after (equal|DIFFER)\)", unrecorded), unrecorded
    # The other copy insertion moves no bit on a CPU: the harness's flag is free to keep or drop.
    steps = by_name["in place steps"][2]
    assert re.fullmatch(r"[\d.]+ ms a step; [\d.]+ ms \([\d.]+x, parameters after equal\)", steps), steps
    resumes = [result for section, _, result, _ in rows if section == "resume"]
    assert all(r.startswith("max_abs_diff=0.0;") for r in resumes), resumes
    assert "| resume " in done.stdout and "MFU" in done.stdout  # the one table, printed
    # The loop's clocks found the calls they time: each step waited for its outputs and put its batch
    # on the device, and only the first waited for the compile (later ones check a flag: microseconds).
    parts = json.loads((runs / "data-wait.json").read_text())
    assert parts["wait for outputs"] > 0 and parts["batch to device"] > 0 and parts["next batch"] > 0
    assert parts["compile wait"] < 0.1 and parts["rest of the loop"] >= 0, parts
    # Logging every step, each copies its parameters for their norms (taken on a thread, waited for at
    # the next step's end); logging every 10th step, the median step copies none.
    sparse = json.loads((runs / "log-every-10.json").read_text())
    copied = "parameters copied for norms"
    assert parts[copied] > 0 and parts["wait for the norms"] >= 0 and sparse[copied] == 0, (parts, sparse)


def test_a_runs_folder_that_holds_an_earlier_check_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # Its runs would resume the earlier check's (a finished run exits 1, "nothing to do") and the
    # sections after it would fail on a device's metered time; refused in one line instead.
    (tmp_path / "data-wait").mkdir()
    out = tmp_path / "table.json"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--runs", str(tmp_path), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--runs {tmp_path} is not an empty folder" in done.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["data-wait"]  # nothing ran
