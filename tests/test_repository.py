"""The repository keeps what it promises newcomers: CI runs the README's test command, the
README's performance table is the recorded run's, no measurements live in code, records stay
lean."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import report

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- ci: test command -->", 1)[1]
    command = re.search(r"```bash\n(.+?)\n", block).group(1)
    ci = (REPO / ".ci" / "run").read_text()
    awk = re.search(r"test_command=\$\(awk '(.+?)' README.md\)", ci).group(1)
    extracted = subprocess.run(["awk", awk, str(REPO / "README.md")], capture_output=True,
                               text=True, check=True).stdout.strip()
    assert extracted == command == 'pip install ".[test]" && python -m pytest -q tests'


def test_readme_performance_table_is_the_recorded_run():
    readme = (REPO / "README.md").read_text()
    source = re.search(r"<!-- performance table: written by benchmarks/report.py --readme "
                       r"from (\S+) -->", readme).group(1)
    result = json.loads((REPO / source).read_text())
    assert report.readme_table(result, source) in readme


def test_readme_is_short():
    assert len((REPO / "README.md").read_bytes()) <= 12.5 * 1024


def test_no_measurements_in_code():
    pattern = re.compile(r"[0-9]+\.[0-9]+ ?(us|µs|ms)\b|run [0-9]+")
    found = [f"{path.relative_to(REPO)}:{n}" for folder in ("jax_swiglu", "ffi")
             for path in (REPO / folder).rglob("*") if path.is_file()
             and path.suffix in (".py", ".h", ".cuh", ".cc", ".in")
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found


def test_records_stay_lean():
    files = [p for folder in ("benchmarks/results", "tests/results")
             for p in (REPO / folder).rglob("*") if p.is_file()]
    assert len(files) <= 40, len(files)
    for folder in ("benchmarks/results/NVIDIA_H200", "tests/results"):
        assert (REPO / folder / "INDEX.md").exists()


@pytest.mark.parametrize("module", ["bench_swiglu", "calibrate", "report", "tuning_data",
                                    "peers", "environment", "profile_kernels",
                                    "tensor_parallel", "model_swap", "bench_fp8"])
def test_benchmarks_import_as_a_package(module):
    __import__(f"benchmarks.{module}")


@pytest.mark.parametrize("script", sorted(
    str(p.relative_to(REPO)) for folder in ("scripts", "benchmarks")
    for p in (REPO / folder).rglob("*.sh") if p.read_text().startswith("#!")))
def test_scripts_run_from_the_repository_root(script):
    # Their paths (ffi/, benchmarks/...) are relative to the root they cd to first; a script
    # moved to another folder must change how far up it goes. (Sourced files have no #!.)
    hops = re.search(r'cd "\$\(dirname "\$0"\)/([./]*)"', (REPO / script).read_text())
    assert hops, f"{script} does not cd to the repository root"
    assert ((REPO / script).parent / hops.group(1)).resolve() == REPO
