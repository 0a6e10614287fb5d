"""The import contract of ``docs/architecture.md`` holds for the code, and the document says
exactly what the code does.

Every ``import`` statement of the package counts, wherever it stands (module level, inside a
function, under ``TYPE_CHECKING``), as does ``importlib.import_module("mtgrpo....")`` with a
literal name: a lazy import is still a dependency. A room is a top-level module or package of
``mtgrpo`` (``mtgrpo.trainer``, ``mtgrpo.config``); ``mtgrpo`` itself is the package's facade,
``src/mtgrpo/__init__.py``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "mtgrpo"
DOC = ROOT / "docs" / "architecture.md"
FACADE = "mtgrpo"

# A table row: | `mtgrpo.room` | layer | `a`, `b` (or "none") | what it is |
_ROW = re.compile(r"^\|\s*`mtgrpo(?:\.(?P<room>[\w]+))?`\s*\|\s*(?P<layer>\d+)\s*\|"
                  r"(?P<imports>[^|]*)\|")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACADE


def _is_room(name: str) -> bool:
    return (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name / "__init__.py").is_file()


def _imported_modules(path: Path) -> Iterator[str]:
    """Every mtgrpo module ``path`` imports, statically or with a literal import_module."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base == FACADE:  # from mtgrpo import room (a submodule) or a facade name
                yield from (f"{base}.{a.name}" if _is_room(a.name) else base for a in node.names)
            else:
                yield base
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) == "import_module" and node.args and isinstance(
                node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.args[0].value


@cache
def code_imports() -> dict[str, set[str]]:
    """room -> the other rooms it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        room = _room(_module_name(path))
        targets = graph.setdefault(room, set())
        for name in _imported_modules(path):
            if name == FACADE or name.startswith(f"{FACADE}."):
                target = _room(name)
                if target != room:
                    targets.add(target)
    return graph


@cache
def documented() -> dict[str, tuple[int, set[str]]]:
    """room -> (layer, the rooms it may import) from the table in docs/architecture.md."""
    rows: dict[str, tuple[int, set[str]]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if not match:
            continue
        room = match["room"] or FACADE
        assert room not in rows, f"{room} has two rows in {DOC.name}"
        cell = match["imports"].strip()
        imports = set() if cell == "none" else {n.strip().strip("`") for n in cell.split(",")}
        rows[room] = (int(match["layer"]), imports)
    return rows


def test_every_room_has_one_row_in_the_document():
    code, doc = set(code_imports()), set(documented())
    assert doc == code, (f"rooms in the code but not in {DOC.name}: {sorted(code - doc)}; rows "
                         f"without a room: {sorted(doc - code)}")


@pytest.mark.parametrize("room", sorted(code_imports()))
def test_a_room_imports_exactly_what_the_document_says(room):
    graph, rows = code_imports(), documented()
    if room not in rows:
        pytest.fail(f"{room} has no row in {DOC.name}")
    listed = rows[room][1]
    assert graph[room] == listed, (
        f"{room} imports {sorted(graph[room] - listed)} that {DOC.name} does not list, and the "
        f"document lists {sorted(listed - graph[room])} that it does not import; change the "
        "code or the table in the same commit"
    )


def test_imports_run_down_the_layers():
    """A room imports only rooms of a lower layer, or of its own layer (written in the table,
    and acyclic: checked below)."""
    rows = documented()
    upward = [(room, target, layer, rows[target][0])
              for room, (layer, imports) in rows.items() for target in imports
              if target in rows and rows[target][0] > layer]
    assert not upward, f"imports that go up a layer (room, target, layers): {upward}"


def test_trl_compatibility_is_imported_only_by_the_facade_and_the_command_line():
    """``mtgrpo.compat`` (TRL's flat config, its trainer defaults, its model arguments) is the
    edge: the rest of the package reads the native configuration."""
    importers = sorted(room for room, targets in code_imports().items() if "compat" in targets)
    assert importers == sorted([FACADE, "cli"])


_CALLBACK_MACHINERY = {"CallbackHandler", "DefaultFlowCallback", "TrainerCallback",
                       "TrainerControl", "TrainerState"}


def test_transformers_callbacks_are_imported_only_by_the_trl_surface():
    """The native trainer decides when to log, evaluate and save itself
    (``mtgrpo.trainer.flow``); transformers' callback machinery belongs to TRL's surface,
    ``mtgrpo.compat``."""
    importers = sorted({
        path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformers")
        and (node.module == "transformers.trainer_callback"
             or {alias.name for alias in node.names} & _CALLBACK_MACHINERY)
    })
    assert importers == ["compat/trainer.py"]


def test_no_cycle_lazy_or_not():
    graph = code_imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(room: str, path: list[str]) -> None:
        state[room] = 1
        for target in sorted(graph.get(room, ())):
            if state.get(target) == 1:
                cycle = [*path[path.index(target):], target]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if state.get(target) is None:
                visit(target, [*path, target])
        state[room] = 2

    for room in sorted(graph):
        if room not in state:
            visit(room, [room])



def test_the_speed_layer_is_used_through_its_package_interface():
    """Outside ``mtgrpo.fast`` the package imports the speed layer as ``mtgrpo.fast`` (the names
    its ``__init__`` exports), never one of its modules: the fast paths can be rearranged
    without touching the RL code."""
    reached = sorted(
        (path.relative_to(ROOT).as_posix(), name)
        for path in PACKAGE.rglob("*.py") if _room(_module_name(path)) != "fast"
        for name in _imported_modules(path) if name.startswith("mtgrpo.fast.")
    )
    assert not reached, f"modules of mtgrpo.fast imported directly (file, module): {reached}"

# Modules that import no model code at all, lazily or not (they run in tools, workers and the
# configuration without torch); the first group also imports numpy only. (mtgrpo.algo.registry
# asks transformers about a name that is not ours; the subprocess test below holds it torch-free
# on import.)
_NUMPY_ONLY = ("algo.metrics", "algo.weighting", "algo.sampling", "algo.advantages")
_MODEL_FREE = ("algo.advantages", "algo.losses", "algo.token_weights", "algo.engine_correction",
               "analysis", "sandbox", *_NUMPY_ONLY)
_MODEL_LIBRARIES = ("transformers", "peft", "accelerate")


def _external_imports(name: str) -> set[str]:
    """Top-level packages outside mtgrpo that a room or a module (``algo.metrics``) imports."""
    base = PACKAGE.joinpath(*name.split("."))
    paths = [base.with_suffix(".py")] if base.with_suffix(".py").is_file() \
        else sorted(base.rglob("*.py"))
    assert paths, f"no module or package {name!r} under {PACKAGE}"
    return {imported.split(".")[0] for path in paths for imported in _imported_modules(path)
            if not imported.startswith(FACADE)}


@pytest.mark.parametrize("name", _MODEL_FREE)
def test_the_algorithm_core_imports_no_model_library(name):
    assert not _external_imports(name) & set(_MODEL_LIBRARIES)
    if name in _NUMPY_ONLY:
        assert "torch" not in _external_imports(name)


def test_building_a_config_imports_no_torch():
    """``GRPOConfig()`` (and the whole default run config) is validated without torch."""
    import subprocess

    code = ("import sys\nfrom mtgrpo.compat import GRPOConfig, load_run_config\n"
            "GRPOConfig()\nload_run_config(None)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "assert 'transformers' not in sys.modules, 'transformers was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def _module_cycles(room: str) -> list[list[str]]:
    """Cycles among the modules of ``room`` (imports anywhere in a module, a function's
    included): each as the modules around it."""
    modules = {_module_name(p): p for p in sorted((PACKAGE / room).rglob("*.py"))}
    edges = {name: {target for target in _imported_modules(path)
                    if target in modules and target != name}
             for name, path in modules.items()}
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(edges[node]):
            if target in path:
                cycle = path[path.index(target):]
                if frozenset(cycle) not in done:
                    done.add(frozenset(cycle))
                    cycles.append(cycle)
            elif len(path) < len(modules):
                visit(target, [*path, target])

    for name in modules:
        visit(name, [name])
    return cycles


_PACKAGE_ROOMS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("room", _PACKAGE_ROOMS)
def test_no_import_cycle_inside_a_package(room):
    """The modules of every package room (``mtgrpo.fast``, ``mtgrpo.algo``, ...) import one
    another one way only (a package's ``__init__`` re-exporting its modules aside): each room
    reads bottom up."""
    cycles = [c for c in _module_cycles(room) if f"mtgrpo.{room}" not in c]
    assert cycles == []
