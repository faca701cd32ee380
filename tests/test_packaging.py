"""Set-up files and docs agree: environment.yml pins what pyproject.toml pins, for the Pythons it and
the Makefile take, the CLI is wired,
the docs show the committed evidence as the report stages of dvc.yaml make it, and every
relative link of the README and docs/ leads to a file and heading that exist."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def test_environment_yml_has_the_same_pins_as_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = set(project["dependencies"]).union(*project["optional-dependencies"].values())
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert {p for p in pip if "==" in p} == pins
    assert all("==" in p for p in pins), "every dependency is pinned"


def test_pyproject_environment_yml_and_the_makefile_take_the_same_pythons():
    """3.11 to 3.13: requires-python, conda's python spec and the Makefile's SUPPORTED list."""
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    makefile = (REPO / "Makefile").read_text()
    low, high = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", requires).groups()
    versions = [f"3.{minor}" for minor in range(int(low), int(high))]
    assert versions == ["3.11", "3.12", "3.13"]
    assert f"python{requires}" in env["dependencies"]
    assert re.search(r"^SUPPORTED := (.*)$", makefile, re.M)[1].split() == versions
    candidates = re.search(r"^PYTHONS := (.*)$", makefile, re.M)[1].split()
    assert candidates == [f"python{v}" for v in reversed(versions)] + ["python3"]


def test_ci_runs_the_readme_test_command():
    readme, ci = (REPO / "README.md").read_text(), (REPO / ".ci" / "run").read_text()
    run_it = readme.split("\n## Run it\n")[1].split("\n## ")[0]
    assert "\nmake run " in run_it and "\nmake test " in run_it
    assert "\nmake test\n" in ci


@pytest.mark.slow
def test_cli_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "incofl.cli", "--help"], capture_output=True, text=True, check=True)
    for command in "prepare partition train table figures paired metrics fedpart bench methods".split():
        assert command in out.stdout


# The evidence tables the docs show and the report-stage outputs (dvc.yaml) they are copied from.
EVIDENCE_TABLES = [
    "results/evidence-inco-vs-heteroavg/cpu/paired-InCoAvg-vs-HeteroAvg.md",
    "results/evidence-inco-vs-heteroavg/gpu/paired-InCoAvg-vs-HeteroAvg.md",
    "results/evidence-inco-vs-heteroavg/cpu-gpu/paired-InCoAvg-vs-HeteroAvg.md",
    "results/evidence-inco-vs-heteroavg/release/paired-InCoAvg-vs-HeteroAvg.md",
    "results/evidence-fedpart/fedpart.md",
    "results/evidence-analysis/cka/cka.md",
    "results/evidence-analysis/theta_beta/table3.md",
    "results/evidence-hetero/table2.md",
    "results/evidence-hetero/paired-InCoHeteroFL-vs-HeteroFL.md",
    "results/evidence-hetero/paired-InCoRolex-vs-FedRolex.md",
    "results/evidence-scalefl/table2.md",
    "results/evidence-scalefl/paired-InCoScaleFL-vs-ScaleFL.md",
    "results/evidence-fedlag/table2.md",
]
# The user-facing Markdown: the front page, docs/ and the generated config reference.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "config" / "README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _stage_outputs() -> set[str]:
    """Every output path of dvc.yaml's stages (a folder stands for the files under it)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return {path for stage in stages.values() for entry in stage.get("outs", []) for path in entry}


def test_evidence_tables_in_the_docs_are_the_committed_report_outputs():
    """Each evidence table is a report stage's output, copied verbatim (each of its Markdown
    tables) into README.md or docs/: numbers in the docs cannot drift from the results they
    claim, and `dvc repro` regenerates each of them."""
    docs, outputs = "\n".join(doc.read_text() for doc in DOCS), _stage_outputs()
    for name in EVIDENCE_TABLES:
        assert any(name == out or name.startswith(out + "/") for out in outputs), f"{name}: no stage makes it"
        tables = [b.strip() for b in (REPO / name).read_text().split("\n\n") if b.startswith("|")]
        assert tables and all(t in docs for t in tables), name


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks), repeats numbered as GitHub does."""
    seen: dict[str, int] = {}
    for line in _prose(doc.read_text()).splitlines():
        if line.startswith("#"):
            slug = _slug(line.lstrip("#"))
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def _prose(text: str) -> str:
    """Markdown without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _relative_links(doc: Path) -> list[tuple[Path, str]]:
    """(target file, anchor) of each relative link or image of a Markdown file."""
    out = []
    for target in LINK.findall(_prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        out.append(((doc.parent / path).resolve() if path else doc, anchor))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(doc):
    for target, anchor in _relative_links(doc):
        where = f"{doc.relative_to(REPO)} links {target}#{anchor}"
        assert target.is_file() and REPO in target.parents, where
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), where


def test_the_link_check_sees_broken_links(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Why? `x` (y)\n\n```\n[no](missing.md)\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#why-x-y) ![img](a.md) [web](https://x.org/a) [bad](a.md#nope) [gone](c.md)"
    )
    assert _anchors(tmp_path / "a.md") == {"top", "why-x-y"}
    assert _relative_links(tmp_path / "a.md") == []
    links = _relative_links(tmp_path / "b.md")
    assert [(t.name, a) for t, a in links] == [("a.md", "why-x-y"), ("a.md", ""), ("a.md", "nope"), ("c.md", "")]
    assert [t.is_file() for t, _ in links] == [True, True, True, False]


def test_citation_file_names_this_version_and_the_licence():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and {"message", "title", "authors"} <= set(cff)
    assert cff["version"] == project["version"], "CITATION.cff's version is pyproject.toml's"
    assert cff["license"] == "MIT" and (REPO / "LICENSE").read_text().startswith("MIT License\n")
