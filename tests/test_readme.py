"""The README and the pages of docs/ name, beside each promise, the test that holds it or the script that
measures it: every name they give must exist, so a renamed or deleted test cannot leave a promise pointing at
nothing."""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re
import shlex
import sys
from pathlib import Path

import pytest

from birdjepa.cli import COMMANDS, main
from birdjepa.config import PretrainConfig
from birdjepa.slurm.sweep import SlurmOptions

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
#: The pages beside the README: every docs/*.md (docs/issues/ holds investigations, each with its own README).
PAGES = {p.relative_to(REPO).as_posix(): p.read_text() for p in sorted((REPO / "docs").glob("*.md"))}
#: Pages whose sections are not a command's promises: design.md states the invariants (each names its test
#: in brackets), benchmarks.md holds the measurements, extending.md is a how-to. Every other page is a user
#: guide that left the README, and each of its sections says what holds its promises, as the README's do.
REFERENCE = ("docs/design.md", "docs/benchmarks.md", "docs/extending.md")
GUIDES = {path: text for path, text in PAGES.items() if path not in REFERENCE}
ALL = "\n".join([README, *PAGES.values()])


def defined(path: Path) -> set[str]:
    """The functions a Python file defines at module level."""
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def test_every_test_and_script_the_readme_names_exists() -> None:
    named = set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", ALL))
    rust = set(re.findall(r"(rust/[\w/]+\.rs)::(\w+)", ALL))
    assert len(named) > 100  # the README and its pages name their tests beside their promises
    missing = [f"{f}::{name}" for f, name in sorted(named) if not (REPO / f).is_file()]
    missing += [
        f"{f}::{name}" for f, name in sorted(named) if (REPO / f).is_file() and name not in defined(REPO / f)
    ]
    missing += [f"{f}::{name}" for f, name in sorted(rust) if f"fn {name}(" not in _text(REPO / f)]
    files = set(re.findall(r"\b((?:tests|scripts|notebooks|docs/issues/[\w-]+)/[\w/]+\.py)\b", ALL))
    missing += [f for f in sorted(files) if not (REPO / f).is_file()]
    assert not missing, missing


def sections(text: str) -> list[str]:
    """A page's sections, each from its heading (``#`` to ``###``) to the next; code blocks, whose
    comments start with ``#`` too, are left out."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.split(r"\n(?=#{1,3} )", "\n" + prose)[1:]


def test_every_section_says_what_holds_its_promises() -> None:
    # The README's text before its first `##` (title, the two set-up commands, what birdjepa is) is the
    # intro; a guide's title says what the page holds, and its text up to the first `##` is a section.
    # A title with no text of its own under it (a page of several sections) promises nothing.
    found = [("README.md", s) for s in sections(README) if not s.startswith("# ")]
    found += [(path, s) for path, text in GUIDES.items() for s in sections(text)]
    assert len(found) > 10 and set(REFERENCE) <= set(PAGES)  # a renamed reference page is renamed here
    bare = [
        f"{path}: {s.splitlines()[0]}"
        for path, s in found
        if "**Tests:**" not in s and "**Measured by:**" not in s and s.strip().count("\n") > 0
    ]
    assert not bare, bare


def test_the_defaults_the_readme_states() -> None:
    # Stated by the README's quickstart and by docs/pretraining.md, data-loader.md, diagnostics.md,
    # sweeps-and-slurm.md and design.md, each naming this test beside the default.
    c = PretrainConfig()
    # `make demo`: LeJEPA with lambda = 0.05, the tiny ViT, a pitch/tempo warp, 600 steps of 16 x 2 views.
    assert (c.objective.kind, c.objective.lejepa.lam, c.model.preset) == ("lejepa", 0.05, "tiny")
    assert c.augment.pitch_bins > 0 and c.augment.stretch > 0
    assert (c.steps, c.data.batch_size, c.data.n_views) == (600, 16, 2)
    assert c.data.interleave is None  # every shard at once ("all")
    assert (c.iid_window, c.log.runs_dir, SlurmOptions().grace) == (100, Path("runs"), 120)
    # The README's first screen: `make` leaves the command in .venv/bin/, beside the interpreter the
    # suite runs in, and a run lands in runs/<run>/.
    assert c.run_dir == Path("runs") / c.run
    if Path(sys.prefix).name == ".venv":  # as `make test` runs the suite (not an installed wheel's)
        assert (Path(sys.prefix) / "bin" / "birdjepa").is_file()
    # birdjepa.verify: no planted fault is active unless asked for.
    debug = dataclasses.asdict(c.debug)  # the verification harness's options, one group
    assert len(debug) >= 5 and not any(debug.values()), debug


def test_pretrain_help_lists_every_option_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for f in dataclasses.fields(PretrainConfig):
        assert f"--{f.name.replace('_', '-')}" in out or f"{f.name}." in out, f.name
    assert "--steps INT" in out and "(default: 600)" in out


def test_make_test_and_ci_hand_out_the_longest_files_first() -> None:
    # What docs/design.md's layout says of `make test` and .ci/run: xdist hands out whole files in
    # collection order (no reordering by test count), and the collection puts conftest's LONGEST_FIRST at
    # its head, or SLOW_LONGEST_FIRST where the run holds slow tests (.ci/run's two slow stages).
    from types import SimpleNamespace

    from conftest import LONGEST_FIRST, SLOW_LONGEST_FIRST, pytest_collection_modifyitems

    recipe = (REPO / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if " -m pytest " in line]
    assert len(ci) == 2 and all("--dist loadfile --no-loadscope-reorder" in line for line in ci), ci
    assert "--dist loadfile --no-loadscope-reorder" in recipe
    collected = sorted((REPO / "tests").glob("test_*.py"))  # pytest's order: by name, two items a file
    for slow, first in [(False, LONGEST_FIRST), (True, SLOW_LONGEST_FIRST)]:
        marks = {"slow"} if slow else set()
        items = [SimpleNamespace(path=path, n=n, get_closest_marker=lambda m, marks=marks: m in marks or None)
                 for path in collected for n in range(2)]  # fmt: skip
        pytest_collection_modifyitems(items)
        files = list(dict.fromkeys(item.path.name for item in items))
        assert set(first) <= set(files)
        assert files[: len(first)] == list(first), slow
        assert files[len(first) :] == sorted(files[len(first) :])  # the rest as collected
        assert [item.n for item in items] == [0, 1] * len(files)  # a file keeps its own order


def bash_lines(text: str) -> list[str]:
    """The command lines of a page's ```bash blocks: continuations joined, comments cut."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [re.sub(r"(^|\s)#.*", "", line).strip() for line in joined.splitlines()]


def words(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, ""
    return list(lex)


def test_every_command_the_pages_show_exists_with_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    """Each `birdjepa <command> ...` line of a bash block in the README or a page names a command that
    exists, with options its `--help` lists; each `make <target>` (there or in the text) is a target of the
    Makefile. Reading `--help` runs no command: a few seconds for every command together."""
    shown: dict[str, set[str]] = {}
    targets = set(re.findall(r"`make ([\w-]+)", ALL))
    for text in (README, *PAGES.values()):
        for line in bash_lines(text):
            tokens = words(line)
            for i, token in enumerate(tokens):
                after = list(
                    itertools.takewhile(lambda t: t not in ("&&", "||", ";", "|", "(", ")"), tokens[i + 1 :])
                )
                if token == "make":
                    targets.update(after[:1])
                if Path(token).name == "birdjepa" and after and not after[0].startswith("-"):
                    options = {t.split("=", 1)[0] for t in after[1:] if t.startswith("--") and t != "--"}
                    shown.setdefault(after[0], set()).update(options)
    assert set(shown) == set(COMMANDS), sorted(set(COMMANDS) ^ set(shown))  # every command has an example
    unknown = []
    for command, options in sorted(shown.items()):
        with pytest.raises(SystemExit) as e:
            main([command, "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0, command
        unknown += [
            f"birdjepa {command} {o}"
            for o in sorted(options)
            if not re.search(re.escape(o) + r"(?![\w.-])", out)
        ]
    assert not unknown, unknown
    makefile = (REPO / "Makefile").read_text()
    assert {"demo", "test"} <= targets
    assert not [t for t in sorted(targets) if not re.search(rf"^{re.escape(t)}:", makefile, flags=re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_resolves_inside_the_repository() -> None:
    """Every link of the README and its pages leads to a file of the repository (and a heading there, if it
    names one), and no text cites a path above the repository."""
    broken = []
    for path, text in {"README.md": README, **PAGES}.items():
        here = (REPO / path).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (here / file).resolve() if file else REPO / path
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{path}: {target}")
            elif anchor and resolved.suffix == ".md":
                headings = re.findall(
                    r"^#{1,6} (.*)",
                    re.sub(r"^```.*?^```", "", resolved.read_text(), flags=re.M | re.S),
                    flags=re.M,
                )
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{path}: {target} (no such heading)")
        depth = len(Path(path).parent.parts)  # a path with more `../` than that leaves the repository
        if re.search(r"(?<![.\w])" + r"\.\./" * (depth + 1), text):
            broken.append(f"{path}: a path above the repository")
    assert not broken, broken


def test_every_command_has_a_row_and_every_page_is_one_link_away() -> None:
    """The README's table has one row per command, linking a page that shows it; every page of docs/ is
    linked from the README itself."""
    rows = re.findall(r"^\| `([\w-]+)` \|.*\]\((docs/[\w-]+\.md)\) \|$", README, flags=re.M)
    assert sorted(c for c, _ in rows) == sorted(COMMANDS)
    assert not [(c, page) for c, page in rows if f"birdjepa {c}" not in PAGES.get(page, "")]
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)[)#]", README))
    assert not sorted(set(PAGES) - linked), "pages no link of the README reaches"
