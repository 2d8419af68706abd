"""birdjepa.analysis on logs whose answer is known by construction: our JSON lines written by the real
MetricsLog (resume events, a segment that redoes steps), CSV/wandb exports (resumes inferred from a step
going back or a clock gap), jump and z-score arithmetic on series built by hand, the `birdjepa analyze`
command's files, and both marimo notebooks run headless."""

from __future__ import annotations

import csv
import datetime
import json
import math
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import run_notebook
from matplotlib.figure import Figure

from birdjepa import analysis
from birdjepa.analysis import figures
from birdjepa.cli import main as birdjepa_main
from birdjepa.rundir.metrics_log import MetricsLog

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_segments(run_dir: Path, segments: list[tuple[int, range, dict]]) -> None:
    """Each segment: (restart, steps, {metric: f(step)}); a segment after the first starts with the resume
    event our trainer writes (checkpoint = its first step - 1)."""
    for restart, steps, fns in segments:
        log = MetricsLog(run_dir, restart=restart)
        if restart:
            log.event("resume", steps[0], checkpoint=steps[0] - 1)
        for s in steps:
            log.log(s, {k: f(s) for k, f in fns.items()})
        log.close()


def test_our_log_splits_at_resume_events_and_a_redo_replaces_steps(tmp_path: Path) -> None:
    # Segment 0 trains to step 9 but its last checkpoint was step 5: segment 1 redoes 6..9 (other values).
    write_segments(tmp_path / "r", [
        (0, range(0, 10), {"train/loss": lambda s: float(s)}),
        (1, range(6, 13), {"train/loss": lambda s: 100.0 + s, "resume/failed": lambda s: 0.0}),
    ])  # fmt: skip
    log = analysis.load_run(tmp_path / "r")
    assert log.name == "r" and log.steps.tolist() == list(range(13))
    assert log.metrics["train/loss"].tolist() == [*map(float, range(6)), *(100.0 + s for s in range(6, 13))]
    (r,) = log.resumes
    assert (r.step, r.segment, r.reason) == (6, 1, "resume event (checkpoint 5)")
    assert r.gap_s >= 0
    # A resume refused before it trained (its checks failed, exit 65), then one that trained: one resume
    # (the refused one was a second, and every table row was there twice).
    refused = MetricsLog(tmp_path / "r", restart=2)
    refused.event("resume", 13, checkpoint=12)
    refused.log(13, {"resume/failed": 1.0})  # the checks' own row, as the trainer writes it
    refused.event("resume_check_failed", 13, failed=["config"], action="error")
    refused.close()
    write_segments(tmp_path / "r", [(3, range(13, 15), {"train/loss": lambda s: float(s)})])
    assert [(r.step, r.segment) for r in analysis.load_run(tmp_path / "r").resumes] == [(6, 1), (13, 2)]


def test_a_resume_by_another_revision_of_the_step_or_on_another_machine_says_so(tmp_path: Path) -> None:
    # A metric a revision redefined (train/grad_norm at revision 4) jumped at an upgraded run's resume
    # with nothing in the report saying why.
    write_segments(tmp_path / "r", [(0, range(0, 3), {"train/loss": float})])
    log = MetricsLog(tmp_path / "r", restart=1)
    log.event("resume", 3, checkpoint=2)
    log.event("machine_changed", 3, device=["Intel Xeon (avx2)", "AMD EPYC (avx512f)"], jaxlib=["0.1", "0.2"])
    log.event("step_revised", 3, revision=[1, 5])
    log.log(3, {"train/loss": 3.0})
    log.close()
    (r,) = analysis.load_run(tmp_path / "r").resumes
    assert r.reason == ("resume event (checkpoint 2); on another kind of machine (device, jaxlib); by "
                        "another revision of the step (1 -> 5, which redefines train/grad_norm)")  # fmt: skip
    # What the event says its run's resume redefines (nothing in a LeJEPA run across revision 6), as
    # `compare` reads it: every run's was said.
    write_segments(tmp_path / "j", [(0, range(0, 3), {"train/loss": float})])
    log = MetricsLog(tmp_path / "j", restart=1)
    log.event("resume", 3, checkpoint=2)
    log.event("step_revised", 3, revision=[5, 6], redefined=[])
    log.event("decode_revised", 3, revision=[None, 3])  # a checkpoint from before the decoder's record
    log.log(3, {"train/loss": 3.0})
    log.close()
    (r,) = analysis.load_run(tmp_path / "j").resumes
    assert r.reason.endswith("by another revision of the step (5 -> 6); by a decoder of another revision "
                             "(unrecorded -> 3)"), r.reason  # fmt: skip


def test_a_log_cut_mid_line_by_a_kill_loads_and_damage_elsewhere_names_the_line(tmp_path: Path) -> None:
    write_segments(tmp_path / "r", [(0, range(3), {"train/loss": float})])
    path = tmp_path / "r" / "metrics.jsonl"
    path.write_text(path.read_text() + '{"step": 3, "train/lo')
    assert analysis.load_run(path).steps.tolist() == [0, 1, 2]
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "garbage", *lines[1:3]]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
        analysis.load_run(path)


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_wandb_export_resumes_are_found_by_step_going_back_and_by_clock_gaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"_step": s, "_timestamp": 1000.0 + 10 * s, "loss": s, "note": "x"} for s in range(20)]
    # A requeued job: 2 h of waiting, then steps go on (no step regression).
    rows += [
        {"_step": s, "_timestamp": 1000.0 + 10 * s + 7200, "loss": s, "note": "x"} for s in range(20, 30)
    ]
    # A resume from an older checkpoint: steps 25.. again, with other values.
    rows += [
        {"_step": s, "_timestamp": 1000.0 + 10 * s + 9000, "loss": -s, "note": ""} for s in range(25, 40)
    ]
    rows[3]["loss"] = ""  # an empty cell: not logged at that step
    log = analysis.load_run(write_csv(tmp_path / "export.csv", rows))
    assert [(r.step, r.reason) for r in log.resumes] == [
        (20, "time gap 7210 s"),
        (25, "step went back from 29"),
    ]
    assert log.resumes[0].gap_s == 7210.0
    assert "note" not in log.metrics  # text columns are not metrics
    steps, loss = log.series("loss")
    assert steps.tolist() == [s for s in range(40) if s != 3]
    assert loss.tolist() == [float(s) for s in range(25) if s != 3] + [-float(s) for s in range(25, 40)]
    # The threshold is a parameter; a larger one leaves only the step regression.
    assert [r.step for r in analysis.load_run(tmp_path / "export.csv", gap_s=8000).resumes] == [25]
    # A segment on a node whose clock is an hour behind: "0 resume(s)".
    back = [{"_step": s, "_timestamp": 1000.0 + 10 * s - 3600 * (s >= 30), "loss": s} for s in range(60)]
    log = analysis.load_run(write_csv(tmp_path / "back.csv", back))
    assert [(r.step, r.reason) for r in log.resumes] == [(30, "the clock went back 3590 s")]
    # Times without a zone, read in the reader's zone: across the night New York's clocks went back, a
    # resume at step 20 there (a gap of 3630 s), none in UTC.
    start = datetime.datetime(2026, 11, 1, 1, 50)  # naive: 01:50 to 02:04:30, 30 s apart
    naive = [{"_step": s, "_timestamp": (start + datetime.timedelta(seconds=30 * s)).isoformat(), "loss": s}
             for s in range(30)]  # fmt: skip
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert analysis.load_run(write_csv(tmp_path / "naive.csv", naive)).resumes == []
    finally:
        monkeypatch.undo()
        time.tzset()
    from birdjepa.analysis.report import summary_markdown  # "-3590.0 s after the previous line"

    said = "- step 30: the clock went back 3590 s, 3590.0 s before the previous line by its clock"
    assert said in summary_markdown(log, [], 10, None, None).splitlines()
    # In-memory rows (wandb's scan_history) read the same way.
    assert [r.step for r in analysis.from_rows("api", rows).resumes] == [20, 25]
    # Each export's analysis beside it, in a folder of its own (two in one folder wrote over each other).
    write_csv(tmp_path / "other.csv", rows)
    for name in ("export", "other"):
        analysis.analyze(tmp_path / f"{name}.csv", metrics=("loss",), window=2)
    assert (tmp_path / "export-analysis" / "summary.md").is_file()
    assert (tmp_path / "other-analysis" / "summary.md").is_file()


def test_a_csv_without_a_step_column_is_named(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "bad.csv", [{"epoch": 1, "loss": 2.0}])
    with pytest.raises(ValueError, match=r"bad.csv row 1: no step column"):
        analysis.load_run(path)
    # An empty step cell said "no step column" of a file that has one.
    path = write_csv(tmp_path / "gap.csv", [{"_step": 0, "loss": 2.0}, {"_step": "", "loss": 1.0}])
    with pytest.raises(ValueError, match=r"gap.csv row 2: its '_step' cell is empty"):
        analysis.load_run(path)


def test_a_value_logged_not_finite_is_named_not_averaged_away(tmp_path: Path) -> None:
    # A NaN at the first step after a resume was dropped from its window's mean, and nothing said so.
    from birdjepa.analysis.report import summary_markdown

    rows = [{"_step": s, "_timestamp": 100 + s, "train/loss": v}
            for s, v in enumerate([1.0, 0.9, 0.85, "nan", 0.8, "inf", 0.6])]  # fmt: skip
    rows[3]["_timestamp"] = rows[4]["_timestamp"] = 2000  # a resume at step 3 (a clock gap)
    log = analysis.load_run(write_csv(tmp_path / "w.csv", rows))
    assert log.non_finite == {"train/loss": [3, 5]}
    text = summary_markdown(log, [], 2, None, None)
    said = (
        "Logged not finite: train/loss at steps 3, 5 (a NaN is left out of its window's mean, an inf "
        "makes it inf)."
    )
    assert said in text.splitlines(), text


def test_a_spreadsheet_s_csv_reads_its_byte_order_mark_and_iso_times(tmp_path: Path) -> None:
    # Its BOM made the step column '\ufeff_step' ("no step column"); ISO times were ignored (no resume
    # found at a 2-hour gap).
    rows = [{"_step": s, "_timestamp": f"2026-01-01T00:{s:02d}:00", "loss": s} for s in range(5)]
    rows += [{"_step": s, "_timestamp": f"2026-01-01T02:{s:02d}:00", "loss": s} for s in range(5, 8)]
    path = write_csv(tmp_path / "sheet.csv", rows)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    log = analysis.load_run(path)
    assert [(r.step, r.reason) for r in log.resumes] == [(5, "time gap 7260 s")]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("run/metrics.jsonl", "", "run/metrics.jsonl: no logged step"),
        ("log.jsonl", '{"event": "resume", "step": 3}\n', "log.jsonl: no logged step"),
        ("header.csv", "_step,loss\n", "header.csv: no logged step"),
        ("empty.csv", "", "empty.csv: no logged step"),
        ("nostep.csv", "epoch,loss\n1,2.0\n", "nostep.csv row 1: no step column"),
        ("text.csv", "step,loss,note\n0,1.0,a\n1,oops,b\n2,3,c\n", "text.csv row 2: column 'loss': 'oops'"),
        # Text among a metric's numbers in our log was dropped as if not logged (line 3 is blank).
        (
            "oops.jsonl",
            '{"step": 0, "x": 1}\n{"step": 1, "x": "nan"}\n\n{"step": 2, "x": "oops"}\n',
            "oops.jsonl:4: 'x': 'oops' is not a number",
        ),
        ("list.jsonl", '{"step": 0, "x": 1}\n{"step": 1, "x": [1, 2]}\n', "list.jsonl:2: 'x': [1, 2] is not"),
        # No numeric metric: a matplotlib traceback (exit 1) and an empty X-analysis/ folder.
        ("notes.csv", "step,note\n0,a\n1,b\n", "notes.csv: no numeric metric"),
        ("bare.jsonl", '{"step": 0, "restart": 0, "time": 1.0}\n', "bare.jsonl: no numeric metric"),
        ("lists.jsonl", '{"step": 0, "x": [1]}\n{"step": 1, "x": [2]}\n', "lists.jsonl: no numeric metric"),
    ],
)
def test_a_log_analyze_cannot_use_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        birdjepa_main(["analyze", str(path.parent if name.startswith("run/") else path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {tmp_path}/{message}") and "Traceback" not in err, err
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith("analysis")]


def test_an_out_analyze_cannot_write_is_exit_2_as_every_command_s(
    resumed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("")  # it said 74, where export's, embed's and evaluate's say 2
    with pytest.raises(SystemExit) as e:
        birdjepa_main(["analyze", str(resumed_run), "--out", str(tmp_path / "afile")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"error: {tmp_path / 'afile'}: exists and is not a folder\n", err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--window", "0"], "--window 0: must be at least 1"),
        (["--metrics"], "--metrics: give at least one"),  # a matplotlib traceback
        (["--gap-s", "-1"], "--gap-s -1.0: must be a number >= 0"),  # a resume at every line
        (["--gap-s", "nan"], "--gap-s nan: must be a number >= 0"),  # none found
    ],
)
def test_analyze_refuses_an_option_that_cannot_work_in_one_line(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        birdjepa_main(["analyze", "any", *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {said}") and err.count("\n") == 1, err


def test_jump_is_post_mean_minus_pre_mean_and_drift_comes_from_steps_away_from_resumes() -> None:
    # x = step, plus 100 from the resume at 50 on; W = 10: pre = mean(40..49) = 44.5, post = mean(50..59)
    # + 100 = 154.5; every window away from the resume drifts by exactly W = 10.
    steps = np.arange(100)
    x = steps + np.where(steps >= 50, 100.0, 0.0)
    log = analysis.RunLog("t", steps, steps * 1.0, {"x": x}, [analysis.Resume(50, 1, "test", 0.0)])
    (j,) = analysis.jumps(log, ["x"], 10)
    assert (j.pre, j.post, j.jump) == (44.5, 154.5, 110.0)
    drift = analysis.normal_drift(log, "x", 10)
    # t in [10, 90] minus the 19 steps t in (40, 60) whose windows straddle the resume at 50.
    assert len(drift) == 81 - 19 and np.all(drift == 10.0)
    assert j.z == math.inf and j.drift_sd == 0.0 and j.n_drift == 62  # constant drift: the jump is off it
    # A diverged step (inf) and a huge value, far before the resume: its windows as they were (prefix sums
    # made every later window nan, or swamped it to 0).
    x[0], x[1] = math.inf, 1e17
    log = analysis.RunLog("t", steps, steps * 1.0, {"x": x}, [analysis.Resume(50, 1, "test", 0.0)])
    (j,) = analysis.jumps(log, ["x"], 10)
    assert (j.pre, j.post, j.jump) == (44.5, 154.5, 110.0)


def test_z_scores_a_real_jump_high_and_a_non_event_low() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(2000)
    noise = rng.normal(0, 1.0, len(steps))
    trend = 5.0 * np.exp(-steps / 500)
    resumes = [analysis.Resume(700, 1, "test", 0.0), analysis.Resume(1400, 2, "test", 0.0)]
    jumped = trend + noise + np.where(steps >= 700, 2.0, 0.0)  # +2 at the first resume, nothing at the second
    log = analysis.RunLog("t", steps, steps * 1.0, {"loss": jumped}, resumes)
    j1, j2 = analysis.jumps(log, ["loss"], 20)
    # The sd of a difference of two 20-step means of unit noise is sqrt(2/20) = 0.316: +2 is ~6 sd.
    assert abs(j1.drift_sd - math.sqrt(2 / 20)) < 0.03
    assert j1.z > 4 and abs(j2.z) < 3


def test_with_a_reference_run_the_drift_is_measured_on_it() -> None:
    # Resumed every 10 steps with W = 10: no quiet window of its own. The straight run (slope 1, no
    # resumes) drifts by exactly 10 per window, so a resumed run that drops by 5 at each resume scores -inf.
    steps = np.arange(60)
    straight = analysis.RunLog("straight", steps, steps * 1.0, {"x": steps * 1.0}, [])
    resumes = [analysis.Resume(s, i + 1, "test", 0.0) for i, s in enumerate(range(10, 60, 10))]
    resumed = analysis.RunLog("resumed", steps, steps * 1.0, {"x": steps - 5.0 * (steps // 10)}, resumes)
    assert len(analysis.normal_drift(resumed, "x", 10)) == 0
    found = analysis.jumps(resumed, ["x"], 10, straight)
    assert [(j.jump, j.n_drift, j.drift_run, j.other_jump) for j in found[:4]] == [
        (5.0, 41, "straight", 10.0)
    ] * 4
    assert all(j.z == -math.inf for j in found[:4])


def test_ema_and_rolling_quantiles_against_plain_loops() -> None:
    values = np.array([1.0, np.nan, 3.0, 2.0, 8.0, np.nan, 4.0])
    alpha = 1 - 0.5 ** (1 / 2.0)
    expected, avg = [], None
    for v in values:
        if not np.isnan(v):
            avg = v if avg is None else avg + alpha * (v - avg)
        expected.append(avg)
    assert analysis.ema(values, 2.0).tolist() == expected
    q = analysis.rolling_quantiles(values, 3, (0.0, 0.5, 1.0))
    for i in range(len(values)):
        seen = [v for v in values[max(0, i - 2) : i + 1] if not np.isnan(v)]
        assert q[:, i].tolist() == [min(seen), float(np.median(seen)), max(seen)]


def test_iid_references() -> None:
    n = 4
    log = analysis.RunLog(
        "t", np.arange(n), np.zeros(n), {"dataloader/window_unique_iid_expected": np.ones(n)}, []
    )
    assert analysis.iid_reference(log, "dataloader/shard_chi2/vs_iid95") == ("IID p95", 1.0)
    label, series = analysis.iid_reference(log, "dataloader/window_unique")
    assert label == "IID expectation" and series.tolist() == [1.0] * n
    assert analysis.iid_reference(log, "dataloader/bucket_lag1/div") == ("IID mean", 0.0)
    assert analysis.iid_reference(log, "dataloader/bucket_chi2/hash") == ("IID mean (255 dof)", 255.0)
    assert analysis.iid_reference(log, "train/loss") is None


@pytest.fixture
def resumed_run(tmp_path: Path) -> Path:
    """300 steps, resumed at 100 (no change) and at 200 (the loss jumps by 1, the IID lag-1 ratio too)."""
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 0.05, 300)

    def loss(s: int) -> float:
        return 3.0 - s / 300 + float(noise[s]) + (1.0 if s >= 200 else 0.0)

    def lag1(s: int) -> float:
        return 0.5 + float(noise[s]) + (3.0 if 200 <= s < 205 else 0.0)

    metrics = {
        "train/loss": loss,
        "dataloader/bucket_lag1/div/vs_iid95": lag1,
        "train/step_time": lambda s: 0.1,
    }
    write_segments(tmp_path / "run", [(0, range(0, 100), metrics), (1, range(100, 200), metrics),
                                      (2, range(200, 300), metrics)])  # fmt: skip
    return tmp_path / "run"


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 5000


def test_analyze_writes_figures_and_a_jump_table(resumed_run: Path, tmp_path: Path, capsys) -> None:
    other = tmp_path / "copy"
    shutil.copytree(resumed_run, other)
    out = tmp_path / "out"
    birdjepa_main(["analyze", str(resumed_run), "--other", str(other), "--window", "20", "--out", str(out)])
    printed = capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    # Of the default metrics this run logged only the loss; it has one IID metric for the grid.
    assert names == [".analysis-files", "iid_grid.png", "overview.png", "summary.md", "window-train_loss.png"]
    assert all(is_png(out / n) for n in names if n.endswith(".png"))
    summary = (out / "summary.md").read_text()
    assert summary in printed and "- step 100: resume event (checkpoint 99)" in summary
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in summary.splitlines()
            if line.startswith("| 1") or line.startswith("| 2")}  # fmt: skip
    assert set(rows) == {("100", "train/loss"), ("200", "train/loss")}
    # An identical run differs by 0.0 everywhere (step_time is a wall-clock metric, never compared).
    assert "max_abs_diff=0.0" in summary
    result = analysis.analyze(resumed_run, window=20, out=tmp_path / "o2",
                              metrics=("train/loss", "dataloader/bucket_lag1/div/vs_iid95"))  # fmt: skip
    quiet, jumped, lag_quiet, lag_jumped = (
        next(j for j in result.jumps if (j.resume_step, j.metric) == key)
        for key in [(100, "train/loss"), (200, "train/loss"), (100, "dataloader/bucket_lag1/div/vs_iid95"),
                    (200, "dataloader/bucket_lag1/div/vs_iid95")]
    )  # fmt: skip
    assert abs(jumped.jump - 1.0) < 0.1 and jumped.z > 10 and abs(quiet.z) < 4
    assert lag_jumped.z > 4 and abs(lag_quiet.z) < 4
    assert result.max_abs_diff is None and quiet.other_max_abs is None
    # Again into the first's folder, of another metric: the first's figures are not left beside it (a
    # mix of two analyses, or two runs'); a file of the user's stays, a figure of the same pattern too (it
    # removed every window-*.png).
    (out / "notes.txt").write_text("mine")
    (out / "window-mine.png").write_text("mine")
    analysis.analyze(resumed_run, window=20, out=out, metrics=("train/step_time",))
    names = sorted(p.name for p in out.iterdir())
    assert names == [".analysis-files", "iid_grid.png", "notes.txt", "overview.png", "summary.md",
                     "window-mine.png", "window-train_step_time.png"]  # fmt: skip


def test_analyze_names_an_unknown_metric(resumed_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Exit 1, without "error:", with every one of the ~80 names the run logged (compare's: exit 2).
    from birdjepa.cli import main

    with pytest.raises(SystemExit) as e:
        main(["analyze", str(resumed_run), "--metrics", "train/lsos"])
    err = capsys.readouterr().err
    said = f"error: --metrics train/lsos: {resumed_run} did not log it ("
    assert e.value.code == 2 and err.startswith(said), err
    assert err.count("\n") == 1 and "; did you mean train/loss" in err, err


def assert_figure(fig: object, tmp_path: Path, panels: int) -> None:
    assert isinstance(fig, Figure)
    assert sum(ax.get_visible() for ax in fig.axes) == panels
    fig.savefig(path := tmp_path / "fig.png")
    assert is_png(path)


def test_resume_window_notebook_runs_headless(resumed_run: Path, tmp_path: Path) -> None:
    out = run_notebook("resume_window", run_path=str(resumed_run), other_path=str(resumed_run))
    assert [j.resume_step for j in out["found"]] == [100, 200]
    assert all(j.other_max_abs == 0.0 for j in out["found"])
    assert_figure(out["window_fig"], tmp_path, panels=2)  # one panel per resume
    assert_figure(out["overview_fig"], tmp_path, panels=1)


def test_iid_grid_notebook_runs_headless(resumed_run: Path, tmp_path: Path) -> None:
    out = run_notebook("iid_grid", run_path=str(resumed_run))
    assert_figure(out["grid_fig"], tmp_path, panels=1)  # the one IID metric this run logged
    assert out["grid_fig"].axes[0].get_title() == "bucket_lag1/div/vs_iid95"
    assert out["panels"].value == [m for m in figures.IID_GRID if m in out["log"].metrics]


def smooth_log(path: Path, resume_at: int, n: int = 60, extra: dict | None = None) -> Path:
    """Our log of a smooth loss (0.01 per step plus small noise) resumed bit-exactly at ``resume_at``."""
    rng = np.random.default_rng(2)
    noise = rng.normal(0, 0.001, n)
    write_segments(path, [
        (0, range(0, resume_at), {"train/loss": lambda s: 0.01 * s + float(noise[s]), **(extra or {})}),
        (1, range(resume_at, n), {"train/loss": lambda s: 0.01 * s + float(noise[s]), **(extra or {})}),
    ])  # fmt: skip
    return path


@pytest.mark.parametrize("resume_at", [3, 57])
def test_a_resume_near_the_start_or_end_scores_against_windows_of_its_own_lengths(
    tmp_path: Path, resume_at: int
) -> None:
    # Its windows cut short by the run's start (3 steps before it) or end (3 after it) were compared with
    # the drift of full windows: a bit-exact resume at step 3 of a smooth loss scored z -78.
    log = analysis.load_run(smooth_log(tmp_path / "r", resume_at))
    (j,) = analysis.jumps(log, ["train/loss"], 10)
    short = (min(10, resume_at), min(10, 60 - resume_at))
    assert abs(j.z) < 4 and j.n_drift > 30 and (j.before, j.after) == short, j
    # The drift is the same statistic over windows of those lengths: 0.01 per step between their centres.
    drift = analysis.normal_drift(log, "train/loss", short[0], short[1])
    assert abs(float(np.mean(drift)) - 0.01 * sum(short) / 2) < 1e-3
    text = analysis.summary_markdown(log, [j], 10, None, None)
    said = f"windows cut by the run's {'start' if resume_at < 30 else 'end'}: {short[0]} step"
    assert said in text, text


def test_a_time_that_is_not_a_number_in_our_log_reads_as_the_csv_s(tmp_path: Path) -> None:
    # "time": null was a TypeError's traceback, an ISO time a ValueError's.
    path = tmp_path / "t.jsonl"
    rows = [{"step": 0, "time": None, "x": 1.0}, {"step": 1, "time": "2026-01-01T00:00:00", "x": 2.0},
            {"step": 2, "time": "2026-01-01T02:00:00", "x": 3.0}]  # fmt: skip
    events = [{"event": "stop", "step": 2, "reason": "done", "exit_code": 0},  # text of events: no metric
              {"event": "nonfinite", "step": 3, "metrics": ["x"], "action": "skip"}]  # fmt: skip
    rows.append({"step": 3, "time": 3.0, "x": "nan"})  # as our log writes a NaN
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:3], *events, rows[3]]))
    log = analysis.load_run(path)
    assert math.isnan(log.time[0]) and log.time[2] - log.time[1] == 7200.0
    assert log.metrics["x"][:3].tolist() == [1.0, 2.0, 3.0] and log.non_finite == {"x": [3]}


def test_ema_over_an_inf_is_silent() -> None:
    # numpy's "invalid value encountered in scalar add" was printed by every analyze of a diverged run.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = analysis.ema(np.array([1.0, math.inf, 2.0, 3.0]), 2.0)
        analysis.rolling_quantiles(np.array([1.0, math.inf, 2.0, math.inf]), 3)
    assert out[:2].tolist() == [1.0, math.inf] and math.isnan(out[2]) and out[3] == 3.0


def test_analyze_of_a_jsonl_writes_beside_it_silently_and_a_run_into_its_analysis(tmp_path: Path) -> None:
    # A log beside a run's metrics.jsonl wrote into the run's "analysis/", over the run's own analysis;
    # an inf printed numpy's RuntimeWarnings (EMA, band, the difference to --other).
    run = smooth_log(tmp_path / "run", 30)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[12]["train/loss"] = "inf"  # as our log writes a diverged step's value
    (run / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        analysis.analyze(run / "a.jsonl", other=run / "metrics.jsonl", metrics=("train/loss",), window=5)
    analysis.analyze(run / "metrics.jsonl", metrics=("train/loss",), window=5)
    assert "inf" in (run / "a-analysis" / "summary.md").read_text()
    assert "inf" not in (run / "analysis" / "summary.md").read_text()


def test_every_line_of_a_figure_is_named_and_the_iid_grid_has_its_x_label() -> None:
    # The overview's legend was on its first panel only: the IID reference's green line in a loader
    # panel was never named.
    n = 30
    steps = np.arange(n)
    metrics = {"train/loss": np.linspace(3, 2, n), "dataloader/window_unique": np.full(n, 5.0),
               "dataloader/window_unique_iid_expected": np.full(n, 5.5)}  # fmt: skip
    log = analysis.RunLog("t", steps, steps * 1.0, metrics, [analysis.Resume(10, 1, "test", 0.0)])
    fig = figures.overview(log, ["train/loss", "dataloader/window_unique"])
    named = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    labelled = {label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]}
    assert "IID expectation" in labelled and named == labelled, (named, labelled)
    grid = figures.iid_grid(log)
    assert [ax.get_xlabel() for ax in grid.axes if ax.get_visible()] == ["step"]
    with pytest.raises(ValueError, match="^no IID metric chosen"):  # "none of the IID metrics [] were logged"
        figures.iid_grid(log, ())
