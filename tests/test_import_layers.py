"""The library's layers import one way: no module imports one that imports it back (lazily or not),
and nothing outside the command line imports it (the library never depends on the shell's grammar)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "lmc_fast"
#: the one circle kept on purpose: `lmc_fast.recipes.instability`, the README's entry point, is a lazy
#: alias of `lmc_fast.instability.instability`, which reads recipes
ALLOWED = [{"lmc_fast.instability", "lmc_fast.recipes"}]


def _modules(root=ROOT) -> dict:
    out = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        package = parts[:-1]
        if parts[-1] == "__init__":
            parts = package = parts[:-1]
        out[".".join(parts)] = (p, package)
    return out


def _graph(mods: dict, packages: bool = False) -> dict:
    """module -> the lmc_fast modules it imports anywhere in its body (imports of a package's __init__,
    its re-exports, left out unless `packages`)."""
    graph = {}
    for name, (path, package) in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = (package[: len(package) - node.level + 1] + ([node.module] if node.module else [])
                        if node.level else node.module.split("."))
                target = ".".join(base)
                hits = {f"{target}.{a.name}" for a in node.names} & set(mods)
                deps |= hits or ({target} & set(mods))
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names} & set(mods)
        graph[name] = {d for d in deps - {name} if packages or mods[d][0].name != "__init__.py"}
    return graph


def _circles(graph: dict) -> list[set]:
    """Strongly connected components of more than one module (Tarjan)."""
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
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    circles = _circles(_graph(_modules()))
    assert [c for c in circles if c not in ALLOWED] == []


def test_the_library_never_imports_the_command_line():
    graph = _graph(_modules(), packages=True)
    for name, deps in graph.items():
        if name.startswith("lmc_fast.cli"):
            continue
        assert not {d for d in deps if d == "lmc_fast.cli" or d.startswith("lmc_fast.cli.")}, name


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [{"a", "b", "c"}]
