"""Where in the code a forward difference arose: the region between the last equal call event and the
first differing one (`birdjepa.train.calls` records each module call's inputs at its start and its
outputs at its end, in the order they ran).

- The first difference is a call's **input**: what its caller computed since the previous event
  differs. The previous event is the end of a sibling's call (``the inputs of B differ while the output
  of A is equal``) or the start of the caller's own call (``... before the caller calls it``); either way
  the code is the caller's method, between those two calls.
- The first difference is a call's **output**, its inputs and every call it made equal: the module's own
  code differs (between its last call and its return), or its parameters do (``params_in``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

_NAME = re.compile(r"^(?P<view>[^/]+)/(?P<path>.+)\.(?P<method>\w+)#(?P<k>\d+)/(?P<io>in|out)(?P<rest>.*)$")


@dataclasses.dataclass(frozen=True)
class Event:
    """One group of a call's tensors: its inputs at its start, or its outputs at its end."""

    view: str
    path: str
    method: str
    k: int
    io: str

    @property
    def call(self) -> str:
        return f"{self.view}/{self.path}.{self.method}#{self.k}"

    @property
    def site(self) -> str:
        return f"{self.path}.{self.method}"


def event(name: str) -> Event | None:
    m = _NAME.match(name)
    if m is None:
        return None
    return Event(m["view"], m["path"], m["method"], int(m["k"]), m["io"])


def _caller(events: list[Event], i: int) -> Event | None:
    """The call whose start is the nearest open one before event ``i`` (the method that made call ``i``)."""
    open_calls: list[Event] = []
    for e in events[:i]:
        if e.io == "in":
            open_calls.append(e)
        elif open_calls and open_calls[-1].call == e.call:
            open_calls.pop()
    target = events[i]
    while open_calls and open_calls[-1].call == target.call:
        open_calls.pop()
    return open_calls[-1] if open_calls else None


def _where(site: str, sites: dict[str, Any]) -> str:
    info = sites.get(site) or {}
    function = info.get("function", site)
    place = f" ({info['file']}:{info['line']})" if info.get("file") else ""
    return f"`{function}`{place}"


def describe(
    order: Sequence[str], first: str, sites: dict[str, Any], params_differ: Sequence[str] = ()
) -> str | None:
    """The region sentence for the first differing forward tensor ``first`` among the forward tensors of
    ``order`` (names, in computation order; the ones before ``first`` are equal). ``params_differ``: the
    module paths whose parameters differ going into the step. None when the names are not call events."""
    events: list[Event] = []
    for name in order:
        e = event(name)
        if e is None:
            return None
        if not events or events[-1] != e:  # several tensors of one event are one event
            events.append(e)
    target = event(first)
    if target is None or target not in events:
        return None
    i = events.index(target)
    if target.io == "in":
        caller = _caller(events, i)
        if caller is None:
            return f"the inputs of `{target.path}` differ from the start of the forward pass"
        prev = events[i - 1]
        code = _where(caller.site, sites)
        if prev.io == "out":
            return (f"the inputs of `{target.path}` differ while the output of `{prev.path}` is equal: the "
                    f"difference arises in {code} between those calls")  # fmt: skip
        return (f"the inputs of `{target.path}` differ while those of `{caller.path}` are equal: the "
                f"difference arises in {code} before it calls `{target.path}`")  # fmt: skip
    owned = [p for p in params_differ if p == target.path or p.startswith(target.path + "/")]
    params = f"its parameters differ ({', '.join(owned)})" if owned else "its parameters are equal"
    inner = [e for e in events[:i] if e.io == "out" and e.path.startswith(target.path + "/")]
    if inner and events[i - 1] == inner[-1]:
        after = f"after its call of `{inner[-1].path}` (whose output is equal)"
        return (f"`{target.path}` gets equal inputs and gives different outputs, {params}: the difference "
                f"arises in {_where(target.site, sites)} {after}")  # fmt: skip
    return (f"`{target.path}` gets equal inputs and gives different outputs, {params}: the module itself "
            f"differs, in {_where(target.site, sites)}")  # fmt: skip


def module_of_param(name: str) -> str:
    """``['encoder']['block_0']['norm1']['scale']`` -> ``encoder/block_0/norm1``."""
    parts = re.findall(r"\['([^']*)'\]", name)
    return "/".join(parts[:-1])
