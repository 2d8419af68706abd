"""Every module call of a model's forward pass, in the order it ran, with its inputs and outputs
(`birdjepa trace`'s ``forward`` stage).

A flax method interceptor sees each call begin and end while the step is traced, so the order of the
entries is the order the program computes them: a module called twice appears at both places, with
what ran in between. Each call gives two groups of entries, named ``PATH.METHOD#K/in/I`` (its array
arguments, at the start) and ``PATH.METHOD#K/out...`` (its outputs, at the end), where PATH is the
module's path (``model`` for the root), METHOD the method and K counts the calls of that method of that
module. Where each method is written (`CALL_SITES`, filled while tracing) goes into the trace's
manifest, so a verdict can name the function, its file and line.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax

#: ``PATH.METHOD`` -> where the method is written: ``{"function", "file", "line"}``.
CALL_SITES: dict[str, dict[str, Any]] = {}


def module_path(module: nn.Module) -> str:
    return "/".join(module.path) or "model"


def _site(module: nn.Module, method: str) -> dict[str, Any]:
    cls = type(module)
    function = getattr(cls, method, None)
    if function is not None:  # flax wraps every module method: name where it is written, not the wrapper
        function = inspect.unwrap(function)
    try:
        file = inspect.getsourcefile(function) if function is not None else None
        lines, first = inspect.getsourcelines(function) if function is not None else ([], None)
    except (OSError, TypeError):
        file, lines, first = None, [], None
    line = first  # the ``def`` line, past any decorators
    if first is not None:
        line = first + next(
            (i for i, t in enumerate(lines) if t.lstrip().startswith(("def ", "async def "))), 0
        )
    try:
        here = Path.cwd().resolve()
    except OSError:  # the working folder removed under the job: the run's first step was a traceback
        here = None
    if file is not None and here is not None and Path(file).resolve().is_relative_to(here):
        file = str(Path(file).resolve().relative_to(here))
    return {"function": f"{cls.__qualname__}.{method}", "file": file, "line": line}


def _arrays(tree: Any, prefix: str) -> list[tuple[str, jax.Array]]:
    """The array leaves of ``tree`` in its own order, named ``prefix/...`` (a lone array: ``prefix``)."""
    if isinstance(tree, dict):
        return [kv for k, v in tree.items() for kv in _arrays(v, f"{prefix}/{k}")]
    if isinstance(tree, (tuple, list)):
        return [kv for i, v in enumerate(tree) for kv in _arrays(v, f"{prefix}/{i}")]
    return [(prefix, tree)] if isinstance(tree, jax.Array) else []


def recorded(apply: Callable[[], Any]) -> tuple[Any, list[tuple[str, jax.Array]]]:
    """``apply()`` (a model's ``apply``), and every module call it made, in order (see the module doc)."""
    entries: list[tuple[str, jax.Array]] = []
    counts: Counter[str] = Counter()
    inside: list[bool] = [False]  # in a call recorded as a whole

    def interceptor(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
        method = context.method_name
        if method == "setup" or method.startswith("_") and method != "__call__" or inside[0]:
            return next_fun(*args, **kwargs)
        site = f"{module_path(context.module)}.{method}"
        CALL_SITES.setdefault(site, _site(context.module, method))
        name = f"{site}#{counts[site]}"
        counts[site] += 1
        entries.extend(_arrays(list(args), f"{name}/in"))
        # A module with ``record_inside`` False (`birdjepa.model.vit.RecomputedBlocks`) is recorded
        # as a whole: what it computes inside is traced in a transformation (a scan), whose values
        # may not leave it.
        inside[0] = not getattr(context.module, "record_inside", True)
        try:
            out = next_fun(*args, **kwargs)
        finally:
            inside[0] = False
        entries.extend(_arrays(out, f"{name}/out"))
        return out

    with nn.intercept_methods(interceptor):
        out = apply()
    return out, entries
