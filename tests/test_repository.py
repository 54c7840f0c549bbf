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
             and path.suffix in (".py", ".h", ".cuh", ".cu", ".cc", ".in")
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


# --- the package's architecture ------------------------------------------------------------

PACKAGE = REPO / "jax_swiglu"
# The package's programs (python -m jax_swiglu.demo / .tune): users of its face, not layers.
PROGRAMS = {"jax_swiglu.demo", "jax_swiglu.tune"}


def _modules():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _face(init: Path) -> set:
    """The names a package's __init__ binds."""
    import ast
    names = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _import_graph():
    """module -> the package's modules it imports (``from .. import _api`` is an import of
    ``_api``; of a package's __init__ only where it takes a name that __init__ binds)."""
    import ast
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    target = ".".join(parts[:len(parts) - node.level + 1])
                    target += "." + node.module if node.module else ""
                else:
                    target = node.module or ""
                if target not in modules:
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        edges.add(f"{target}.{alias.name}")
                    elif (modules[target].name != "__init__.py"
                          or alias.name in _face(modules[target])):
                        edges.add(target)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
        edges.discard(name)
        graph[name] = edges
    return graph


def test_no_layer_imports_the_package_face():
    """The package's face (jax_swiglu/__init__.py) is for users: no module of the library
    imports a name from it (the version lives in _version.py)."""
    graph = _import_graph()
    assert not [m for m, edges in graph.items() if "jax_swiglu" in edges and m not in PROGRAMS]


def test_the_import_chain_stays_short():
    """The longest chain of the library's modules importing modules (the programs aside):
    nn -> _api -> _primitive -> selection -> engine -> heuristic -> _launch -> _native ->
    _layout and the nn modules above them. A new layer should replace one, not add one."""
    import functools
    graph = _import_graph()

    @functools.cache
    def depth(module, seen=()):
        if module in seen:
            return 0
        return 1 + max((depth(d, seen + (module,)) for d in graph[module] if d not in PROGRAMS),
                       default=0)
    deepest = max(depth(m) for m in graph if m not in PROGRAMS)
    assert deepest <= 12, deepest


# Environment variables the package reads, each a documented user switch (README.md).
USER_SWITCHES = {"JAX_SWIGLU_KERNEL", "JAX_SWIGLU_CACHE_DIR", "XDG_CACHE_HOME"}


def test_only_documented_switches_are_read():
    """No environment variable steers a call but the documented user switches: launches are
    forced with ``launch=``, a parameter of the traced call."""
    access = re.compile(r"""os\.(?:environ(?:\.get)?\s*[\[(]|getenv\()\s*(["']?)(\w+)""")
    read = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        constants = dict(re.findall(r'^(\w+) = "([A-Z_]+)"', text, re.MULTILINE))
        for quote, name in access.findall(text):
            read.add(name if quote else constants.get(name, name))
    assert read and read <= USER_SWITCHES, read - USER_SWITCHES
    readme = (REPO / "README.md").read_text()
    assert all(name in readme for name in {"JAX_SWIGLU_KERNEL", "JAX_SWIGLU_CACHE_DIR"})


def test_no_test_clears_jax_caches_to_force_a_launch():
    found = [str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*.py")
             if "clear_caches(" in p.read_text() and p.name != "test_repository.py"]
    assert not found
