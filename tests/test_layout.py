"""The layout shows the architecture: engined/ grouped by role, and no import cycles
(lazy, function-level imports included: they only hid the loader/checkpoint/manifest one)."""
import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINED = ROOT / "engined"
TOP_LEVEL = {"__init__.py", "__main__.py", "_helper_build.py", "config.py", "errors.py",
             "metrics.py"}
ROLES = {"chat", "commands", "engine", "grammar", "layers", "models", "ops", "serving", "weights"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """engined module -> the engined modules it imports anywhere in its body."""
    modules = {module_name(p): p for p in ENGINED.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in modules else node.module)
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done, path = set(), []

    def visit(node) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            cycle = visit(dep)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    return next((c for c in map(visit, sorted(graph)) if c), None)


def test_engined_has_no_import_cycle():
    graph = import_graph()
    assert graph["engined.weights.loader"] >= {"engined.weights.kimi_checkpoint"}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_engined_top_level_is_roles_and_a_handful_of_modules():
    files = {p.name for p in ENGINED.iterdir() if p.suffix == ".py"}
    folders = {p.name for p in ENGINED.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert files <= TOP_LEVEL, sorted(files - TOP_LEVEL)
    assert folders == ROLES | {"helper"}  # helper/: the C wrapper


@pytest.mark.parametrize("module", ["engined.layers.linear", "engined.layers.attention",
                                    "engined.ops.llama_decode_layer", "engined.models.llama"])
def test_each_entry_module_imports_first(module):
    """A fresh interpreter importing `module` before anything else (a bench script's order)."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
