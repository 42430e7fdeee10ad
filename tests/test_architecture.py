"""The layering of the three packages, read from the source with `ast` (imports inside functions
included, so a cycle cannot hide in a function body):

1. `envs` and `kernels` import nothing from `rl`, and neither imports the other;
2. the modules of `rl` import each other without a cycle;
3. the packages of `rl` form layers, lowest first (`RL_LAYERS`): a module imports only from its own
   package or from the packages below it, and `rl/` holds no module outside them but its
   `__init__`;
4. no module in `rl` sets the kernels' process-wide backend (`kernels.set_backend`,
   `kernels.use_backend`): the backend travels as a value (`backend=`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("rl", "envs", "kernels")
GLOBAL_BACKEND_SETTERS = ("set_backend", "use_backend")
RL_LAYERS = ("config", "core", "nn", "replay", "fused", "agents", "sebulba", "run", "cli")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def parse_modules(root: Path = REPO) -> dict[str, tuple[Path, ast.Module]]:
    """{module name: (path, syntax tree)} for every module under the packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            modules[module_name(path, root)] = (
                path,
                ast.parse(path.read_text(), filename=str(path)),
            )
    return modules


def imported_modules(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` imports anywhere in its source. `from pkg import x`
    imports pkg.x if that is a module, else pkg; `import a.b.c` imports the longest known prefix."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def known_prefix(dotted: str) -> str | None:
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in known:
                return candidate
        return None

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..a import b
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            full = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            targets = [module if module in known else base for module in full]
        else:
            continue
        for target in targets:
            module = known_prefix(target)
            if module is not None and module != name:
                found.add(module)
    return found


def import_graph(modules: dict[str, tuple[Path, ast.Module]]) -> dict[str, set[str]]:
    known = set(modules)
    return {
        name: imported_modules(name, path, tree, known) for name, (path, tree) in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def top(module: str) -> str:
    return module.split(".")[0]


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    forbidden = {"envs": ("rl", "kernels"), "kernels": ("rl", "envs")}
    return sorted(
        f"{name} imports {dep}"
        for name, deps in graph.items()
        for dep in deps
        if top(dep) in forbidden.get(top(name), ())
    )


def rl_layer(module: str) -> int | None:
    """The index in `RL_LAYERS` of the package holding `module` (rl.<package>...), None for `rl`
    itself and for a module outside the packages."""
    parts = module.split(".")
    if parts[0] != "rl" or len(parts) < 2 or parts[1] not in RL_LAYERS:
        return None
    return RL_LAYERS.index(parts[1])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a imports b` for every import in `rl` from a package above the importer's, and for every
    module of `rl` outside the layers (other than `rl` itself)."""
    found = []
    for name, deps in graph.items():
        if top(name) != "rl" or name == "rl":
            continue
        layer = rl_layer(name)
        if layer is None:
            found.append(f"{name} is in no layer")
            continue
        for dep in deps:
            if (
                top(dep) == "rl"
                and dep != "rl"
                and (rl_layer(dep) is None or rl_layer(dep) > layer)
            ):
                found.append(f"{name} imports {dep}")
    return sorted(found)


def backend_setters(modules: dict[str, tuple[Path, ast.Module]], package: str = "rl") -> list[str]:
    """Calls of set_backend / use_backend (as a name or any attribute, e.g. kernels.set_backend,
    kernels.launch.use_backend) in the modules of `package`, and imports of those names."""
    found = []
    for name, (path, tree) in modules.items():
        if top(name) != package:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func
                called = (
                    fn.attr
                    if isinstance(fn, ast.Attribute)
                    else fn.id
                    if isinstance(fn, ast.Name)
                    else None
                )
                if called in GLOBAL_BACKEND_SETTERS:
                    found.append(f"{name}:{node.lineno} calls {called}")
            elif isinstance(node, ast.ImportFrom) and any(
                alias.name in GLOBAL_BACKEND_SETTERS for alias in node.names
            ):
                found.append(
                    f"{name}:{node.lineno} imports "
                    f"{', '.join(a.name for a in node.names if a.name in GLOBAL_BACKEND_SETTERS)}"
                )
    return found


@pytest.fixture(scope="module")
def modules():
    return parse_modules()


def test_every_package_is_parsed(modules):
    assert {top(name) for name in modules} == set(PACKAGES)
    assert {"rl.run.train", "rl.agents.qlearning", "envs.wrappers", "kernels.launch"} <= set(
        modules
    )


def test_envs_and_kernels_import_nothing_from_rl_nor_each_other(modules):
    assert layering_violations(import_graph(modules)) == []


def test_rl_modules_import_each_other_without_a_cycle(modules):
    graph = import_graph(modules)
    rl_graph = {
        name: {dep for dep in deps if top(dep) == "rl"}
        for name, deps in graph.items()
        if top(name) == "rl"
    }
    assert (
        sum(map(len, rl_graph.values())) > 20
    )  # the graph was really read (imports inside functions too)
    assert "rl.run.wandb_logger" in rl_graph["rl.run.train"]  # an import inside a function counts
    assert find_cycle(rl_graph) is None, " -> ".join(find_cycle(rl_graph))


def test_rl_packages_import_only_their_own_layer_and_those_below(modules):
    graph = import_graph(modules)
    assert all((REPO / "rl" / package / "__init__.py").exists() for package in RL_LAYERS), (
        "every layer is a package"
    )
    assert upward_imports(graph) == []


def test_no_module_in_rl_sets_the_kernels_process_wide_backend(modules):
    assert backend_setters(modules) == []


# ---------------------------------------------------------------- the checks catch real violations


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_fail_on_violations(tmp_path):
    _write(
        tmp_path,
        {
            "rl/__init__.py": "",
            "rl/a.py": "def f():\n    from rl import b\n",  # rl.a -> rl.b, inside a function
            "rl/b.py": "from rl.c import thing\n",  # rl.b -> rl.c (thing is no module)
            "rl/c.py": (  # rl.c -> rl.a
                "import kernels\n\n"
                "def g(config):\n    import rl.a\n    kernels.set_backend(config)\n"
            ),
            "rl/d.py": (
                "from kernels.launch import use_backend\n\n"
                "with use_backend('interpret'):\n    pass\n"
            ),
            "envs/__init__.py": "def make():\n    from rl.core.environment import make_env\n",
            "envs/x.py": "from . import wrappers\nimport kernels.launch\n",
            "envs/wrappers.py": "",
            "kernels/__init__.py": "",
            "kernels/launch.py": "from envs import x\n",
        },
    )
    modules = parse_modules(tmp_path)
    graph = import_graph(modules)
    assert (
        graph["rl.a"] == {"rl.b"}
        and graph["rl.b"] == {"rl.c"}
        and graph["rl.c"] == {"kernels", "rl.a"}
    )
    cycle = find_cycle(
        {k: {d for d in v if top(d) == "rl"} for k, v in graph.items() if top(k) == "rl"}
    )
    assert upward_imports(graph) == [f"rl.{m} is in no layer" for m in "abcd"]
    assert upward_imports({"rl.core.x": {"rl.nn.y", "rl.config.z"}, "rl.nn.y": {"rl.core.x"}}) == [
        "rl.core.x imports rl.nn.y"
    ]
    assert cycle is not None and set(cycle) == {"rl.a", "rl.b", "rl.c"}
    assert layering_violations(graph) == [
        "envs imports rl",
        "envs.x imports kernels.launch",
        "kernels.launch imports envs.x",
    ]
    setters = backend_setters(modules)
    assert (
        "rl.c:5 calls set_backend" in setters
        and "rl.d:1 imports use_backend" in setters
        and "rl.d:3 calls use_backend" in setters
    )
