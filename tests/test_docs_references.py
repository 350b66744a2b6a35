"""Every reference into `docs/` from the code, tests, configs and the docs themselves names a file that exists and a
heading it has (GitHub's anchor of the heading text), and every "design rule N" is one of the numbered rules of
docs/architecture.md: a clone of the project holds everything its comments cite."""
from __future__ import annotations

import os
import re

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO_ROOT, "docs")
SOURCES = ("ragen_jax", "environments", "experiments", "configs", "tests", "docs")
# `docs/x.md#anchor` anywhere, and `x.md#anchor` inside docs/ (links between the docs); the anchor is optional
REFERENCE = re.compile(r"(docs/)?([a-z_]+\.md)(#[a-z0-9_-]+)?")
DESIGN_RULE = re.compile(r"design rules? (\d+)")


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a markdown heading: lower case, punctuation other than '-' and '_' dropped, spaces
    to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_github_anchor_of_worked_examples():
    assert github_anchor("Loss scaling and soft reweighting") == "loss-scaling-and-soft-reweighting"
    assert github_anchor("GRPO and Dr.GRPO") == "grpo-and-drgrpo"
    assert github_anchor("The walk of one training step") == "the-walk-of-one-training-step"
    assert github_anchor("KL estimators (and placements)") == "kl-estimators-and-placements"


def lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def headings(path: str) -> set[str]:
    return {github_anchor(line.lstrip("#")) for line in lines(path) if line.startswith("#")}


def source_files():
    for top in SOURCES:
        for folder, _, names in os.walk(os.path.join(REPO_ROOT, top)):
            for name in names:
                if name.endswith((".py", ".md")) and name != os.path.basename(__file__):  # this file's examples
                    yield os.path.join(folder, name)
    yield os.path.join(REPO_ROOT, "README.md")


def references():
    """(citing file, line number, docs file name, anchor or None) of every reference."""
    for path in source_files():
        in_docs = os.path.dirname(path) == DOCS
        for number, line in enumerate(lines(path), start=1):
            for match in REFERENCE.finditer(line):
                prefixed, name, anchor = match.groups()
                if prefixed or (in_docs and anchor):
                    yield os.path.relpath(path, REPO_ROOT), number, name, anchor and anchor[1:]


def test_every_docs_reference_resolves():
    found = list(references())
    assert len(found) > 100  # the code cites the docs throughout
    known = {name: headings(os.path.join(DOCS, name)) for name in os.listdir(DOCS) if name.endswith(".md")}
    broken = [f"{where}:{line}: docs/{name}" + (f"#{anchor}" if anchor else "")
              for where, line, name, anchor in found
              if name not in known or (anchor is not None and anchor not in known[name])]
    assert not broken, "\n".join(broken)


def test_design_rules_cited_are_numbered_in_the_architecture_doc():
    text = "\n".join(lines(os.path.join(DOCS, "architecture.md")))
    rules = text[text.index("## Design rules"):]
    numbered = {int(n) for n in re.findall(r"^(\d+)\. \*\*", rules, flags=re.M)}
    assert numbered == set(range(1, len(numbered) + 1)) and len(numbered) >= 10
    cited = {(os.path.relpath(path, REPO_ROOT), int(n)) for path in source_files()
             for n in DESIGN_RULE.findall("\n".join(lines(path)))}
    assert cited and not [c for c in cited if c[1] not in numbered]


@pytest.mark.parametrize("stale", ["spec ", "RAGEN2_SPEC", "DESIGN.md", "ANCHORS.md"])
def test_no_reference_to_documents_a_clone_does_not_have(stale):
    """The design notes the project was built from are not shipped; the code cites docs/ instead."""
    pattern = re.compile(r"\bspec [A-H](\.\d+)?\b" if stale == "spec " else re.escape(stale))
    hits = [f"{os.path.relpath(path, REPO_ROOT)}:{number}" for path in source_files()
            for number, line in enumerate(lines(path), start=1) if pattern.search(line)]
    assert not hits, hits
