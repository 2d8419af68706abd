"""Console progress: a tqdm bar with loss and throughput on a terminal, plain periodic lines otherwise
(Slurm logs, pipes), so a log file gets one readable line every few steps instead of bar redraws."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping

from tqdm import tqdm


class Progress:
    def __init__(
        self, *, total: int, start: int, batch_size: int, every: int, tty: bool | None = None
    ) -> None:
        self.total, self.batch_size, self.every = total, batch_size, max(every, 1)
        self.tty = sys.stdout.isatty() if tty is None else tty
        self._mark = (start, time.perf_counter())  # throughput since the last report
        self._first: tuple[int, float] | None = None  # the first line's step and time: the ETA's origin
        self.bar = (
            tqdm(total=total, initial=start, file=sys.stdout, dynamic_ncols=True, unit="step")
            if self.tty
            else None
        )

    def _throughput(self, step: int) -> float:
        done, now = step + 1 - self._mark[0], time.perf_counter()
        rate = done * self.batch_size / max(now - self._mark[1], 1e-9)
        self._mark = (step + 1, now)
        return rate

    def step(self, step: int, metrics: Mapping[str, float], epoch: int = 0) -> None:
        """After step ``step``, whose batch reached the data's pass ``epoch`` (from 0: nothing said how far
        through the data a run was): advance the bar, or print a line every ``every`` steps and at the
        end."""
        loss, acc = metrics["train/loss"], metrics["train/probe_acc"]
        if self.bar is not None:
            self.bar.update(1)
            if step % self.every == 0 or step == self.total - 1:
                rate = self._throughput(step)
                self.bar.set_postfix_str(
                    f"epoch {epoch} loss {loss:.4f} probe_acc {acc:.3f} {rate:.1f} clips/s"
                )
        elif step % self.every == 0 or step == self.total - 1:
            rate = self._throughput(step)
            print(
                f"step {step}/{self.total} epoch {epoch} loss {loss:.4f} probe_acc {acc:.3f} "
                f"{rate:.1f} clips/s (data wait {metrics['train/data_wait']:.3f} s){self._eta(step)}",
                flush=True,
            )

    def _eta(self, step: int) -> str:
        """``, ETA 1h02m`` from the steps since the first line (a log's lines had no time to go: what a
        Slurm log is read for); nothing on the first line, whose step waited for the compile."""
        now = time.perf_counter()
        if self._first is None:
            self._first = (step, now)
            return ""
        done, left = step - self._first[0], self.total - 1 - step
        if done <= 0 or left <= 0:
            return ""
        s = round(left * (now - self._first[1]) / done)
        return f", ETA {s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f", ETA {s // 60}m{s % 60:02d}s"

    def message(self, text: str) -> None:
        """A line that does not break the bar."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
