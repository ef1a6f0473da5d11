"""Short argument lists: no function in framework/ takes more than 7 parameters (self or cls not counted; *args and
**kwargs count one each), and a constructor with more than 6 takes those past the 6th by keyword only: an __init__,
and a dataclass's (its fields and its bases' in the package; `kw_only=True` or a `_: KW_ONLY` marker). Read from the
source with ast, so a function counts whether or not anything imports or calls it. Values built once and handed down
(framework/assemble.py's RunContext, a DataShare, the trainer's options) are what keeps the lists short."""
import ast
from pathlib import Path

import pytest

from support.processes import REPO

PACKAGE = REPO / "framework"
MOST_PARAMETERS = 7
MOST_POSITIONAL_IN_A_CONSTRUCTOR = 6


def functions(tree: ast.AST):
    """(function, is a method) for every def in the module, nested ones included."""
    def walk(node, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child, in_class
                yield from walk(child, False)
            else:  # a class's body holds methods; an if or a with inside it too
                yield from walk(child, isinstance(child, ast.ClassDef) or in_class)
    yield from walk(tree, False)


def positional(function: ast.FunctionDef, method: bool) -> list[str]:
    names = [a.arg for a in function.args.posonlyargs + function.args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    return names[1:] if method and not static and names else names


def parameters(function: ast.FunctionDef, method: bool) -> int:
    args = function.args
    return (len(positional(function, method)) + len(args.kwonlyargs) + (args.vararg is not None)
            + (args.kwarg is not None))


def offenders(root: Path) -> tuple[list[str], list[str]]:
    """(functions past MOST_PARAMETERS, constructors past 6 parameters with more than 6 positional) under root."""
    too_long, positional_constructors = [], []
    for path in sorted(root.rglob("*.py")):
        for function, method in functions(ast.parse(path.read_text())):
            where = f"{path.relative_to(root.parent)}:{function.lineno} {function.name}"
            count = parameters(function, method)
            if count > MOST_PARAMETERS:
                too_long.append(f"{where} ({count} parameters)")
            if method and function.name == "__init__" and count > MOST_POSITIONAL_IN_A_CONSTRUCTOR:
                if len(positional(function, method)) > MOST_POSITIONAL_IN_A_CONSTRUCTOR:
                    positional_constructors.append(f"{where} ({len(positional(function, method))} positional)")
    return too_long, positional_constructors


def _decorator(node: ast.ClassDef) -> ast.expr | None:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Name) and target.id == "dataclass") or (
                isinstance(target, ast.Attribute) and target.attr == "dataclass"):
            return d
    return None


def _own_fields(node: ast.ClassDef) -> list[bool]:
    """Whether each init field the class declares is keyword-only, in order."""
    decorator = _decorator(node)
    keyword = isinstance(decorator, ast.Call) and any(
        k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True for k in decorator.keywords)
    fields = []
    for statement in node.body:
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        annotation = ast.unparse(statement.annotation)
        if annotation in ("KW_ONLY", "dataclasses.KW_ONLY"):
            keyword = True
            continue
        if "ClassVar" in annotation:
            continue
        value = statement.value
        if isinstance(value, ast.Call) and any(k.arg == "init" and isinstance(k.value, ast.Constant)
                                               and k.value.value is False for k in value.keywords):
            continue
        fields.append(keyword)
    return fields


def dataclass_offenders(root: Path) -> list[str]:
    """Dataclasses past 6 init fields (with their bases' in the package) with more than 6 positional ones."""
    classes = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _decorator(node) is not None:
                classes.setdefault(node.name, []).append((path, node))

    def fields(node: ast.ClassDef) -> list[bool]:
        inherited = []
        for base in node.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            if name in classes and classes[name][0][1] is not node:
                inherited += fields(classes[name][0][1])
        return inherited + _own_fields(node)

    found = []
    for name, defined in classes.items():
        for path, node in defined:
            every = fields(node)
            positional = every.count(False)
            if len(every) > MOST_POSITIONAL_IN_A_CONSTRUCTOR and positional > MOST_POSITIONAL_IN_A_CONSTRUCTOR:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {name} ({positional} positional)")
    return sorted(found)


def test_no_function_in_the_package_takes_more_than_seven_parameters():
    too_long, _ = offenders(PACKAGE)
    assert too_long == []


def test_a_constructor_past_six_parameters_takes_the_rest_by_keyword():
    _, positional_constructors = offenders(PACKAGE)
    assert positional_constructors == []


def test_a_dataclass_past_six_fields_takes_the_rest_by_keyword():
    assert dataclass_offenders(PACKAGE) == []


@pytest.mark.parametrize("source, expected", [
    ("def f(a, b, c, d, e, f, g): pass", ([], [])),
    ("def f(a, b, c, d, e, f, g, h): pass", (["f (8 parameters)"], [])),
    ("def f(a, b, c, d, e, f, *, g, h): pass", (["f (8 parameters)"], [])),
    ("def f(a, b, c, d, e, f, g, *args): pass", (["f (8 parameters)"], [])),
    ("class C:\n    def m(self, a, b, c, d, e, f, g): pass", ([], [])),
    ("class C:\n    @staticmethod\n    def m(a, b, c, d, e, f, g, h): pass", (["m (8 parameters)"], [])),
    ("class C:\n    def __init__(self, a, b, c, d, e, f, g): pass", ([], ["__init__ (7 positional)"])),
    ("class C:\n    def __init__(self, a, b, c, d, e, f, *, g): pass", ([], [])),
    ("def outer():\n    def inner(a, b, c, d, e, f, g, h): pass", (["inner (8 parameters)"], [])),
])
def test_the_rule_counts_what_it_says(tmp_path, source, expected):
    (tmp_path / "framework").mkdir()
    (tmp_path / "framework" / "m.py").write_text(source + "\n")
    found = offenders(tmp_path / "framework")
    assert tuple([line.split(" ", 1)[1] for line in kind] for kind in found) == expected


@pytest.mark.parametrize("source, expected", [
    ("@dataclass\nclass D:\n" + "".join(f"    f{i}: int\n" for i in range(6)), []),
    ("@dataclass\nclass D:\n" + "".join(f"    f{i}: int\n" for i in range(7)), ["D (7 positional)"]),
    ("@dataclass(frozen=True, kw_only=True)\nclass D:\n" + "".join(f"    f{i}: int\n" for i in range(7)), []),
    ("@dataclass\nclass D:\n" + "".join(f"    f{i}: int\n" for i in range(6)) + "    _: KW_ONLY\n    g: int\n", []),
    ("@dataclass\nclass D:\n" + "".join(f"    f{i}: int\n" for i in range(7)).replace("f6: int", "f6: int = field(init=False)")
     + "    c: ClassVar[int] = 0\n", []),
    ("@dataclass\nclass B:\n    a: int\n    b: int\n@dataclass\nclass D(B):\n"
     + "".join(f"    f{i}: int\n" for i in range(5)), ["D (7 positional)"]),
    ("@dataclass(kw_only=True)\nclass B:\n    a: int\n    b: int\n@dataclass\nclass D(B):\n"
     + "".join(f"    f{i}: int\n" for i in range(5)), []),
])
def test_the_dataclass_rule_counts_what_it_says(tmp_path, source, expected):
    (tmp_path / "framework").mkdir()
    (tmp_path / "framework" / "m.py").write_text(source)
    assert [line.split(" ", 1)[1] for line in dataclass_offenders(tmp_path / "framework")] == expected
