"""The signals that stop a run at a step boundary, saved: who asked (a preemption or its user), what the
run says when it comes, and which one a group of processes stops for."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from birdjepa import exit_codes

#: SIGTERM and SIGUSR1 (Slurm's warning signal) ask the loop to save at the step boundary and exit, and
#: so does a first Ctrl-C (SIGINT): Python's own KeyboardInterrupt lost every step since the last save.
#: So does a SIGHUP (the terminal of a run started in an ssh session closed): it killed the run unsaved.
#: And a SIGXCPU, a soft CPU-time limit's warning before the hard limit's SIGKILL (Slurm passes a login
#: shell's `ulimit -t` on to its jobs): it killed the run unsaved, exit 152; a preemption, requeued.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU)
#: What the user sends (or their terminal): ignored where the shell ignores it (``nohup``, a background
#: job without job control), and not a preemption, so not requeued.
USER_SIGNALS = {signal.SIGINT: exit_codes.INTERRUPTED, signal.SIGHUP: exit_codes.HUNG_UP}
CTRL_C = (
    "\nCtrl-C: stopping after this step, with a checkpoint (exit 130; the same command resumes). Ctrl-C "
    "again quits at once, losing the steps since the last checkpoint written (and one being written).\n"
)
CTRL_C_AT_THE_LAST = (
    "\nCtrl-C: the run stops after this step anyway (its last, or --stop-at-step), with a checkpoint (exit "
    "0). Ctrl-C again quits at once, losing the steps since the last checkpoint written (and one being "
    "written).\n"
)
#: Once the loop has stopped for its own reason (a non-finite step, a failed save or resume check):
#: "exit 130; the same command resumes" said, and the run exited with its own code.
CTRL_C_STOPPING = (
    "\nCtrl-C: the run is stopping already, exit {code} (the line above says why). Ctrl-C again quits at "
    "once.\n"
)


class StopRequest:
    """Records a stop signal for the loop (`pretrain` puts the previous handlers back when it returns). A
    second Ctrl-C raises KeyboardInterrupt; an ignored SIGINT (a job started in the background by a
    shell without job control) stays ignored. A preemption (SIGTERM, SIGUSR1) is the signal the run
    stops for once it came, before or after a Ctrl-C: its exit (75) requeues the job."""

    def __init__(self, signals: Sequence[int] = STOP_SIGNALS, *, speaks: bool = True) -> None:
        self.signal: int | None = None
        self.cpu_limit = False  # a SIGXCPU came, whichever signal the run stops for: it comes again
        self.ctrl_c = False
        # Set by the loop: the code the run exits with whatever a Ctrl-C asks (0: the segment ends at the
        # step a stop would come); None while a stop would change it.
        self.ending_with: int | None = None
        self.speaks = speaks  # process 0 alone, in a group: a terminal said it once per process
        # Asked now: once the terminal hung up, isatty() says no (its ioctl fails too).
        self.terminal = [fd for fd in (1, 2) if os.isatty(fd)]
        self.watch(signals)

    def watch(self, signals: Sequence[int]) -> None:
        for sig in signals:
            if sig not in USER_SIGNALS or signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.cpu_limit |= signum == signal.SIGXCPU
        if signum == signal.SIGINT:
            if self.ctrl_c:  # the second, whatever came between
                raise KeyboardInterrupt
            self.ctrl_c = True
            if self.signal is None:
                if self.speaks:  # os.write, not print: the handler may interrupt a print
                    code = self.ending_with
                    said = CTRL_C if code is None else CTRL_C_AT_THE_LAST if code == 0 else CTRL_C_STOPPING
                    os.write(sys.stderr.fileno(), said.format(code=code).encode())
                self.signal = signum
            return
        if signum == signal.SIGHUP:
            # The terminal is gone: a write to it fails (EIO) and would stop the save that follows.
            with open(os.devnull, "wb") as null:
                for fd in self.terminal:
                    os.dup2(null.fileno(), fd)
            if self.signal is not None:  # a preemption's (requeue) or a Ctrl-C's stays the reason
                return
        if self.signal is None or self.signal in USER_SIGNALS:  # Slurm's USR1 then its TERM: the USR1
            self.signal = signum


def group_stop(signals: Sequence[int]) -> int | None:
    """The signal a group of processes stops for, from each one's (0: none): a preemption's wherever one
    came (its exit requeues the job), else a user's. One process's Ctrl-C made the others exit 75 and it
    130, and logged "signal on another process"."""
    came = [s for s in signals if s]
    return next((s for s in came if s not in USER_SIGNALS), came[0] if came else None)
