"""The layers the code obeys: docs/architecture.md lists the import-linter contract's layers, no cycles."""

import ast
import re
import sys
from pathlib import Path

import grimp
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "onnxsmith"


def _contract_layers() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    [layers] = [c for c in config["contracts"] if c["type"] == "layers"]
    return [" | ".join(part.strip() for part in layer.split("|")) for layer in layers["layers"]]


def _documented_layers() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- layers:.*?-->\s*```\n(.*?)```\s*<!-- /layers -->", text, re.S)
    assert block, "docs/architecture.md has no <!-- layers --> block"
    layers = []
    for line in block.group(1).splitlines():
        names = re.match(r"^([a-z0-9_]+(?:/|\.py)(?: \| [a-z0-9_]+(?:/|\.py))*)", line)
        assert names, f"not a layer line: {line!r}"
        layers.append(names.group(1).replace("/", "").replace(".py", ""))
    return layers


def test_the_document_lists_the_contracts_layers():
    assert _documented_layers() == _contract_layers()


def test_every_package_is_a_layer():
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in SRC.glob("*.py") if p.stem not in ("__init__", "__main__")}
    layered = {name.strip() for layer in _contract_layers() for name in layer.split("|")}
    assert packages | modules == layered


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("onnxsmith")


def test_no_module_imports_itself_through_a_cycle(graph):
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            if chain:
                cycles.append(" -> ".join((module, *chain)))
    assert cycles == []


def test_onnxscript_and_onnx_ir_are_used_through_their_public_modules():
    private = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] in ("onnxscript", "onnx_ir") and any(p.startswith("_") for p in parts[1:]):
                    private.append(f"{path.relative_to(REPO)}:{node.lineno}: {module}")
    assert private == []


ENGINES = ("onnx", "onnx_ir", "onnxruntime", "numpy", "onnxscript")


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["fp16", "--help"],
        ["int8", "--help"],
        ["quantize", "--help"],
        [],
        ["validate", "--help"],
        ["validate", "--task", "generic", "--help"],
        ["predict", "--task", "faceage", "--help"],
    ],
)
def test_help_loads_no_engine(argv):
    """``--help`` reads onnxsmith.settings, never the engines (a second of imports: docs/benchmarks.md); a task's
    options too (settings/tasks.py)."""
    import subprocess

    probe = (
        "import sys\n"
        "from onnxsmith.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in {ENGINES!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]
    assert "usage: onnxsmith" in done.stdout  # the help was printed, not an error


def test_every_command_still_registers_its_flags():
    """Lazily registered, each command's parser still has its own flags (the full parser, as before)."""
    from onnxsmith.cli.main import COMMANDS, build_parser, command_name

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert sorted(commands) == sorted(command_name(m) for m in COMMANDS)
    for name, command in commands.items():
        assert command.get_default("func") is not None, name


MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_a_screen():
    """A function over 80 lines does several things: split it where its steps are (issue 25)."""
    long = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_module_shadows_a_call_of_the_api():
    """``onnxsmith.int8(...)`` is the API's call: a subpackage ``onnxsmith/int8/`` would replace it once imported."""
    import onnxsmith

    public = [name for name in dir(onnxsmith) if not name.startswith("_") and callable(getattr(onnxsmith, name))]
    assert public, "onnxsmith exports no calls"
    shadowing = [n for n in public if (SRC / n).is_dir() or (SRC / f"{n}.py").is_file()]
    assert not shadowing, shadowing
