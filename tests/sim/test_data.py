"""The repository's ``data/`` folder: the simulator's default trace directory holds every file
the simulator names, each file matches the page that documents it (rows, columns, SHA-256, a
source and a licence), and nothing in the project reads the old ``../shared`` folder beside the
repository any more."""

from __future__ import annotations

import csv
import hashlib
import io
import re
import subprocess
from pathlib import Path

import pytest

from flexlease.sim import traces
from flexlease.sim.scenario import DEFAULT_DATA_DIR

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
CSV_FILES = sorted(p.name for p in DATA.glob("*.csv"))
NAMED = (
    traces.PHILLY_JOBS,
    traces.ALIBABA_JOBS,
    traces.HELIOS_MONTH,
    traces.HELIOS_48H,
    traces.PHILLY_UTIL,
)


def test_the_default_data_dir_is_the_repositorys_data_folder() -> None:
    assert DEFAULT_DATA_DIR == DATA
    assert sorted(NAMED) == CSV_FILES


@pytest.mark.parametrize("name", CSV_FILES)
def test_each_file_matches_its_page(name: str) -> None:
    raw = (DATA / name).read_bytes()
    rows = list(csv.reader(io.StringIO(raw.decode())))
    header, body = rows[0], rows[1:]
    page = (DATA / name).with_suffix(".md").read_text()
    assert page.startswith(f"# {name}\n")
    assert f"{len(body):,} rows" in page
    assert hashlib.sha256(raw).hexdigest() in page
    for field in ("**Source:**", "**Licence:**", "## Columns", "## Caveats"):
        assert field in page, f"{name}'s page has no {field}"
    documented = re.findall(r"^\| `(\w+)` \|", page.split("## Columns", 1)[1], flags=re.MULTILINE)
    assert documented == header
    assert all(len(row) == len(header) for row in body)
    index = (DATA / "README.md").read_text()
    assert f"| `{name}` | {len(body):,} |" in index
    assert f"]({Path(name).stem}.md)" in index


def test_the_job_traces_parse() -> None:
    philly = traces.parse_jobs(traces.read_text(DATA / traces.PHILLY_JOBS), source=traces.PHILLY_JOBS)
    alibaba = traces.parse_jobs(traces.read_text(DATA / traces.ALIBABA_JOBS), source=traces.ALIBABA_JOBS)
    # rows with a zero duration request nothing and are dropped (each page says how many)
    assert (len(philly), len(alibaba)) == (33_107, 2_257)
    month = traces.parse_util(traces.read_text(DATA / traces.HELIOS_MONTH), source=traces.HELIOS_MONTH)
    assert month.period == pytest.approx(31 * traces.DAY)


def test_nothing_reads_the_shared_folder_beside_the_repository() -> None:
    """Code, scripts, manifests and configuration name no path under ``../shared``: a clone
    of the project has everything it reads."""
    sources = subprocess.run(
        [
            "git",
            "ls-files",
            "-z",
            "--",
            "*.py",
            "*.sh",
            "*.toml",
            "*.yaml",
            "*.yml",
            "*.json",
            "*.cfg",
            "Dockerfile*",
        ],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    pattern = re.compile(
        r"\.\./shared\b|(?<![\w.])shared/(?:data|papers)\b|/work/shared\b|[\"']shared[\"'] */"
    )
    me = Path(__file__).relative_to(REPO).as_posix()
    hits = [
        f"{name}:{n}: {line.strip()}"
        for name in sources.split("\0")
        if name and name != me
        for n, line in enumerate((REPO / name).read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits
