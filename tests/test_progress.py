"""Console progress: a bar on a terminal, a plain line every `every` steps (and the last) otherwise."""

from __future__ import annotations

import pytest

from birdjepa.pretrain.progress import Progress

METRICS = {"train/loss": 0.25, "train/probe_acc": 0.5, "train/data_wait": 0.001}


def test_plain_lines_every_n_steps_and_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    p = Progress(total=25, start=3, batch_size=8, every=10, tty=False)
    for step in range(3, 25):
        p.step(step, METRICS, epoch=step // 8)  # nothing said how far through the data a run was
    p.message("eval step 24: probe_acc 0.500")
    p.close()
    lines = capsys.readouterr().out.splitlines()
    assert [x.split()[1:4] for x in lines[:-1]] == [["10/25", "epoch", "1"], ["20/25", "epoch", "2"],
                                                    ["24/25", "epoch", "3"]]  # fmt: skip
    assert all("loss 0.2500 probe_acc 0.500" in x and "clips/s" in x for x in lines[:-1])
    assert lines[-1] == "eval step 24: probe_acc 0.500"


def test_plain_lines_say_the_time_left_from_the_steps_since_the_first_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Slurm log's lines gave no time left. 2 s a step; the first line (the compile's step) says none.
    from birdjepa.pretrain import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    p = Progress(total=4000, start=0, batch_size=8, every=1000, tty=False)
    for step in range(4000):
        now[0] = 2.0 * (step + 1)
        p.step(step, METRICS)
    lines = capsys.readouterr().out.splitlines()
    assert [x.rsplit(")", 1)[1] for x in lines] == ["", ", ETA 1h39m", ", ETA 1h06m", ", ETA 33m18s", ""]


def test_terminal_bar_counts_from_the_resumed_step(capsys: pytest.CaptureFixture[str]) -> None:
    p = Progress(total=25, start=20, batch_size=8, every=2, tty=True)
    assert p.bar is not None and p.bar.n == 20
    for step in range(20, 25):
        p.step(step, METRICS)
    assert p.bar.n == 25
    p.message("stopping")
    p.close()
    out = capsys.readouterr().out
    assert "25/25" in out and "loss 0.2500 probe_acc 0.500" in out and "stopping" in out
