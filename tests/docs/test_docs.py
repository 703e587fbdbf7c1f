"""The documentation: the field reference (docs/reference.md) is generated from the policy model
and must not drift from it, nor must the chart's files generated beside it; every relative link
in README.md and docs/ leads to a file and heading that exist (`make test` also builds the site
with `mkdocs build --strict`, which checks the docs pages' links the same way)."""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference.md"
PAGES = sorted(DOCS.glob("*.md"))
MARKDOWN = [ROOT / "README.md", *PAGES]


def _update_docs_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("update_docs", ROOT / "hack" / "update-docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_field_reference_is_generated_from_the_model() -> None:
    docs = _update_docs_module()
    reference = REFERENCE.read_text()
    assert reference == docs.with_field_table(reference), (
        "docs/reference.md's field table is stale: run `make docs`"
    )


def test_field_reference_covers_the_profile_fields() -> None:
    reference = REFERENCE.read_text()
    for field in ("gpuShare", "maxMemory", "overcommitRatio", "priority", "preemptible"):
        assert f"`spec.profiles[].{field}`" in reference


def test_the_field_table_lives_in_the_reference_only() -> None:
    docs = _update_docs_module()
    for path in MARKDOWN:
        if path != REFERENCE:
            assert docs.START not in path.read_text(), f"{path.relative_to(ROOT)}"


def test_chart_files_generated_from_the_model_are_current() -> None:
    docs = _update_docs_module()
    generated = docs.generated_files()
    names = {path.relative_to(ROOT).as_posix() for path in generated}
    assert {
        "charts/gpuwarden/values.schema.json",
        "charts/gpuwarden/files/gpupolicy.schema.json",
    } <= names
    for path, text in generated.items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `make docs`"


# --- links -------------------------------------------------------------------------------------

FENCE = re.compile(r"^ *(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$")


def _prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it (and MkDocs' toc, for the headings used here)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    for line in _prose_lines(path):
        match = HEADING.match(line)
        if match:
            slug = base = _slug(match.group(2))
            n = 0
            while slug in anchors:
                n += 1
                slug = f"{base}-{n}"
            anchors.add(slug)
    return anchors


def _relative_links(path: Path) -> list[str]:
    links = []
    for line in _prose_lines(path):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(1)
            if not SCHEME.match(target):
                links.append(target)
    return links


def test_the_link_checker_sees_the_readmes_links() -> None:
    links = _relative_links(ROOT / "README.md")
    assert "docs/install.md#prerequisites-and-steps" in links
    assert all(not link.startswith("http") for link in links)
    assert "prerequisites-and-steps" in _anchors(DOCS / "install.md")


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_lead_to_existing_files_and_headings(path: Path) -> None:
    broken = []
    for link in _relative_links(path):
        name, _, anchor = link.partition("#")
        target = (path.parent / name).resolve() if name else path
        if not target.exists():
            broken.append(f"{link}: no file {target.relative_to(ROOT)}")
            continue
        if path.parent == DOCS and DOCS not in [target, *target.parents]:
            broken.append(f"{link}: outside docs/, which the site cannot link to")
        if anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = re.findall(r"^ +- [^:\n]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(page.name for page in PAGES)


def test_update_docs_says_updated_only_for_files_it_changed(tmp_path: Path) -> None:
    docs = _update_docs_module()
    path = tmp_path / "generated.txt"
    assert docs.write_if_changed(path, "one\n") is True
    before = path.stat().st_mtime_ns
    assert docs.write_if_changed(path, "one\n") is False
    assert path.stat().st_mtime_ns == before
    assert docs.write_if_changed(path, "two\n") is True and path.read_text() == "two\n"


# --- shown command output ----------------------------------------------------------------------


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_shown_command_output_is_what_the_command_prints_today(path: Path) -> None:
    """Every ``<!-- output: COMMAND -->`` block is the command's output, run now."""
    docs = _update_docs_module()
    text = path.read_text()
    stale = []
    for match in docs.OUTPUT_BLOCK.finditer(text):
        shown, today = match["body"], docs.command_output(match["command"])
        if shown != today:
            diff = difflib.unified_diff(
                shown.splitlines(), today.splitlines(), "shown", "today", lineterm=""
            )
            stale.append(f"<!-- output: {match['command']} -->\n" + "\n".join(diff))
    assert not stale, (
        f"{path.relative_to(ROOT)}: shown output drifted; run `make docs` "
        "(.venv/bin/python hack/update-docs.py) to regenerate it:\n" + "\n\n".join(stale)
    )


def test_the_readmes_shown_outputs_are_all_generated() -> None:
    docs = _update_docs_module()
    commands = [m["command"] for m in docs.OUTPUT_BLOCK.finditer((ROOT / "README.md").read_text())]
    assert commands[0] == "make run"
    assert any(c.startswith("gpuwarden review ") for c in commands)
    assert any(c.startswith("gpuwarden explain ") for c in commands)
    assert any(c.startswith("gpuwarden apply ") for c in commands)


def test_a_filtered_output_marks_the_lines_it_leaves_out() -> None:
    docs = _update_docs_module()
    shown = docs.command_output("gpuwarden lint policies | grep -E '^ok: '")
    assert shown.startswith("...\nok: 1 policies, 14 profiles, ")
