"""`policies` is the pure core: no clock, no await, no I/O. import-linter enforces the imports (make lint);
this reads the source for what an import check cannot see."""

import ast
from pathlib import Path

import policies

FORBIDDEN_CALLS = {"time", "monotonic", "perf_counter", "now", "utcnow", "today", "open", "sleep"}


def _modules():
    root = Path(policies.__file__).parent
    return sorted(root.rglob("*.py"))


def test_no_clock_no_await_no_io_in_policies():
    problems = []
    for path in _modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncWith, ast.AsyncFor)):
                problems.append(f"{path.name}:{node.lineno}: async code")
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in FORBIDDEN_CALLS:
                    problems.append(f"{path.name}:{node.lineno}: call to {name}()")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    top = name.split(".")[0]
                    if top in {"time", "datetime", "asyncio", "socket", "aiohttp", "kubernetes_asyncio", "grpc",
                               "prometheus_client", "prometheus_api_client", "autoscaler", "loadtest"}:
                        problems.append(f"{path.name}:{node.lineno}: imports {name}")
    assert not problems, problems


def test_the_check_sees_a_violation(tmp_path):
    """Guard against a check that cannot fail: the same walk flags a clock read."""
    tree = ast.parse("import time\nx = time.time()\n")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") in FORBIDDEN_CALLS]
    assert calls
