"""The package's shape: modules import one way (no cycle, function-level imports included), the
tuning database never reaches kernel code, and activation ids are the names cl/common.h defines."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from yolo_cl.layers import ACTIVATIONS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "engine"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["yolo_cl"] + parts)


def import_graph() -> dict:
    """{module: set of package modules it imports anywhere in its text}."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    deps.add(sub if sub in files else target)
        graph[mod] = {d for d in deps if d in files and d != mod}
    return graph


def cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_cycle_finder_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_tuning_database_never_calls_kernel_code():
    graph = import_graph()
    reach, todo = set(), ["yolo_cl.tuning_db"]
    while todo:
        m = todo.pop()
        for d in graph[m]:
            if d not in reach:
                reach.add(d)
                todo.append(d)
    assert not {m for m in reach if m.startswith("yolo_cl.kernels")}


def test_only_the_registry_reads_a_configs_family():
    """Callers ask kernels/family.py which family a config belongs to; none compares names itself."""
    reads = re.compile(r"""(get\(\s*["']family["']|\[\s*["']family["']\s*\]|\.FAMILY\b)""")
    found = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
             if p.name != "family.py" and reads.search(p.read_text())]
    assert found == []


def test_activation_names_are_defined_in_common_h():
    text = (ROOT / "cl" / "common.h").read_text()
    defined = set(re.findall(r"#define A_([A-Z0-9_]+) \d+", text))
    assert {a.upper() for a in ACTIVATIONS} == defined
