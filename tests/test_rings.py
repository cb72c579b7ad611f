"""Imports run one way: the model core <- the run ring <- the apps, with no circles.

The graph is read from the source (every `import` of a transformer_jax module, in functions too), so a lazy import
that runs upward counts like any other.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "transformer_jax"

# The model core: what a user importing our layers, model or searches gets, and nothing about runs.
CORE = ("config", "errors", "section", "sharding", "accounting", "layers", "model", "decoding")
# The apps: command lines, sweeps, conversions to other engines, pictures.
APPS = ("__main__", "cli", "sweep", "interop", "visualize")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def owner(name: str) -> str:
    """The module a dotted import name lives in (`transformer_jax.decoding.beam.beam_search` -> its module)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found |= {owner(alias.name) for alias in node.names if alias.name.startswith("transformer_jax.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_jax"):
            assert node.module is not None
            found |= {owner(f"{node.module}.{alias.name}") for alias in node.names}
    return found - {module, "transformer_jax"}


GRAPH = {module: imports_of(module) for module in MODULES}


def ring(module: str) -> int:
    """0 core, 1 run, 2 apps; the package itself (its face: `transformer_jax.load`) is not ranked."""
    first = module.removeprefix("transformer_jax.").split(".")[0]
    return 0 if first in CORE else 2 if first in APPS else 1


def test_the_graph_is_read():
    """The oracle can fail: known arrows are found, a lazy import inside a function included."""
    assert "transformer_jax.layers.kv_cache" in GRAPH["transformer_jax.layers.attention"]
    assert "transformer_jax.translate" in GRAPH["transformer_jax"]  # `load` imports it inside the function
    assert ring("transformer_jax.decoding.beam") == 0 and ring("transformer_jax.cli") == 2


def test_no_import_runs_from_a_lower_ring_to_a_higher_one():
    upward = [
        f"{module} (ring {ring(module)}) -> {target} (ring {ring(target)})"
        for module, targets in GRAPH.items()
        if module != "transformer_jax"
        for target in targets
        if ring(target) > ring(module)
    ]
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_no_import_circles():
    """Tarjan's strongly connected components of the module graph: every one is a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize(
    ("statement", "absent"),
    [
        ("import transformer_jax.layers", ("decoding", "experiment", "train", "workdir", "data")),
        ("import transformer_jax.decoding", ("experiment", "train", "workdir", "data", "checkpoint")),
    ],
)
def test_the_core_loads_nothing_about_runs(statement, absent):
    """What a user importing our layers or searches into their own model actually loads (a fresh interpreter)."""
    code = (
        f"import sys; {statement}; print(' '.join(sorted(m for m in sys.modules if m.startswith('transformer_jax'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert statement.split()[-1] in loaded
    wrong = [name for name in loaded if name.removeprefix("transformer_jax.").split(".")[0] in absent]
    assert not wrong, f"{statement} loads {wrong}"
