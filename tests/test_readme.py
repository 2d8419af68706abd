"""The README names, beside each promise, the test that holds it or the script that measures it: every
name it gives must exist, so a renamed or deleted test cannot leave a promise pointing at nothing."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from birdjepa.cli import main
from birdjepa.config import PretrainConfig
from birdjepa.slurm.sweep import SlurmOptions

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def defined(path: Path) -> set[str]:
    """The functions a Python file defines at module level."""
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def test_every_test_and_script_the_readme_names_exists() -> None:
    named = set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", README))
    rust = set(re.findall(r"(rust/[\w/]+\.rs)::(\w+)", README))
    assert len(named) > 100  # the README names its tests beside its promises
    missing = [f"{f}::{name}" for f, name in sorted(named) if not (REPO / f).is_file()]
    missing += [
        f"{f}::{name}" for f, name in sorted(named) if (REPO / f).is_file() and name not in defined(REPO / f)
    ]
    missing += [f"{f}::{name}" for f, name in sorted(rust) if f"fn {name}(" not in _text(REPO / f)]
    files = set(re.findall(r"\b((?:tests|scripts|docs/issues/[\w-]+)/[\w/]+\.py)\b", README))
    missing += [f for f in sorted(files) if not (REPO / f).is_file()]
    assert not missing, missing


def test_every_section_says_what_holds_its_promises() -> None:
    sections = re.split(r"\n(?=#{2,3} )", README)[1:]  # the text before the first section is the intro
    bare = [s.splitlines()[0] for s in sections if "**Tests:**" not in s and "**Measured by:**" not in s]
    assert not bare, bare


def test_the_defaults_the_readme_states() -> None:
    c = PretrainConfig()
    # `make demo`: LeJEPA with lambda = 0.05, the tiny ViT, a pitch/tempo warp, 600 steps of 16 x 2 views.
    assert (c.objective.kind, c.objective.lejepa.lam, c.model.preset) == ("lejepa", 0.05, "tiny")
    assert c.augment.pitch_bins > 0 and c.augment.stretch > 0
    assert (c.steps, c.data.batch_size, c.data.n_views) == (600, 16, 2)
    assert c.data.interleave is None  # every shard at once ("all")
    assert (c.iid_window, c.log.runs_dir, SlurmOptions().grace) == (100, Path("runs"), 120)
    # birdjepa/faults.py: no planted fault is active unless asked for.
    debug = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name.startswith("debug_")}
    assert len(debug) >= 5 and not any(debug.values()), debug


def test_pretrain_help_lists_every_option_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for f in dataclasses.fields(PretrainConfig):
        assert f"--{f.name.replace('_', '-')}" in out or f"{f.name}." in out, f.name
    assert "--steps INT" in out and "(default: 600)" in out


def test_make_test_hands_out_the_longest_files_first() -> None:
    # What the README's tests line says of `make test`: xdist hands out whole files in collection order
    # (no reordering by test count), and the collection puts conftest's LONGEST_FIRST at its head.
    from types import SimpleNamespace

    from conftest import LONGEST_FIRST, pytest_collection_modifyitems

    recipe = (REPO / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "--dist loadfile --no-loadscope-reorder" in recipe
    collected = sorted((REPO / "tests").glob("test_*.py"))  # pytest's order: by name, two items a file
    items = [SimpleNamespace(path=path, n=n) for path in collected for n in range(2)]
    pytest_collection_modifyitems(items)
    files = list(dict.fromkeys(item.path.name for item in items))
    assert set(LONGEST_FIRST) <= set(files)
    assert files[: len(LONGEST_FIRST)] == list(LONGEST_FIRST)
    assert files[len(LONGEST_FIRST) :] == sorted(files[len(LONGEST_FIRST) :])  # the rest as collected
    assert [item.n for item in items] == [0, 1] * len(files)  # a file keeps its own order
