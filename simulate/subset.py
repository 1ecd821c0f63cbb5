"""The NKI meta-programming subset: what the real compiler accepts that plain Python also would.

The NKI language guide lists the values a kernel handles (None, bools, 32-bit integers, 32-bit
floats, strings, tensors), the containers (tuples, lists, dicts with string keys, classes derived
from ``NKIObject`` only, enumerations) and says every other Python feature is a compile error.
The simulator runs kernels as Python, so it checks, at launch:

- the kernel function's source: no ``try``, generators (``yield``), ``async``/``await``,
  ``global``/``nonlocal``, sets, or classes that derive from anything but ``NKIObject``/``Enum``;
- every argument: a tensor, number (integers within 32 bits), string, None, dtype, ALU operator,
  function, ``NKIObject`` or ``Enum`` member, or a tuple / dict (string keys) of those.

Each refusal is a ``SubsetError`` naming the construct and the kernel line, or the argument.
The check covers the ``nki.jit`` function's body and, as the real compiler inlines them, the
helper functions it calls, transitively: every call whose callee resolves statically (a name in
the function's globals or closure, or ``module.name`` / ``Class.name`` of one) to a Python
function outside the simulator, NumPy and the standard library. Calls through values known only
at run time (a function passed as an argument, a method of an instance) are not followed.
"""

from __future__ import annotations

import ast
import enum
import inspect
import os
import sysconfig
import textwrap

import numpy as np

from .errors import ValidationError

INT32 = (-2**31, 2**32 - 1)            # signed or unsigned 32-bit
_checked = {}                          # code object -> None | SubsetError


class SubsetError(ValidationError):
    """Kernel code or an argument outside the Python subset the NKI compiler accepts."""


_REFUSED = {
    ast.Try: "try/except", ast.Yield: "yield (generators)", ast.YieldFrom: "yield from",
    ast.Await: "await", ast.AsyncFor: "async for", ast.AsyncWith: "async with",
    ast.AsyncFunctionDef: "async def", ast.Global: "global", ast.Nonlocal: "nonlocal",
    ast.Set: "set displays", ast.SetComp: "set comprehensions",
}
if hasattr(ast, "TryStar"):
    _REFUSED[ast.TryStar] = "try/except*"
_CLASS_BASES = {"NKIObject", "Enum", "IntEnum"}


def _base_name(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "?")


def _violation(tree):
    for node in ast.walk(tree):
        for kind, what in _REFUSED.items():
            if isinstance(node, kind):
                return node, f"{what} is not part of the NKI language"
        if isinstance(node, ast.ClassDef):
            bad = [_base_name(b) for b in node.bases if _base_name(b) not in _CLASS_BASES]
            if bad or not node.bases:
                return node, (f"class {node.name} must derive from NKIObject (or Enum) and no "
                              f"other class")
    return None


def check_function(fn) -> None:
    """Raise ``SubsetError`` when ``fn``'s source, or a helper it calls, uses Python the NKI
    compiler refuses."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    if code not in _checked:
        _checked[code] = _scan(fn, code, fn.__name__, set())
    if _checked[code] is not None:
        raise _checked[code]


def _scan(fn, code, kernel, seen):
    """The first refusal in ``fn`` or the helpers it calls (None when clean); ``kernel``
    names the launched function in the message, ``seen`` the code objects visited."""
    seen.add(code)
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None                                  # no source (exec'd): nothing to check
    try:
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return None
    found = _violation(tree)
    if found is not None:
        node, message = found
        where = f"{code.co_filename.rsplit('/', 1)[-1]}:{first + node.lineno - 1}"
        via = "" if fn.__name__ == kernel else f" (in helper {fn.__name__}, which it calls)"
        return SubsetError(f"kernel {kernel}{via}: {message}", op="nki.jit", location=where)
    for helper in _helpers(fn, tree):
        hcode = helper.__code__
        if hcode in seen:
            continue
        error = _scan(helper, hcode, kernel, seen)
        if error is not None:
            return error
    return None


def _helpers(fn, tree):
    """Python functions ``fn`` calls by a name its globals or closure bind (or an attribute
    of one), outside the simulator, NumPy and the standard library."""
    scope = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                scope[name] = cell.cell_contents
            except ValueError:                       # an empty cell (assigned later)
                pass
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target, chain = node.func, []
        while isinstance(target, ast.Attribute):
            chain.append(target.attr)
            target = target.value
        if not isinstance(target, ast.Name) or target.id not in scope:
            continue
        value = scope[target.id]
        for attr in reversed(chain):
            if not (inspect.ismodule(value) or inspect.isclass(value)):
                value = None
                break
            value = inspect.getattr_static(value, attr, None)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
        if inspect.isfunction(value) and _user_code(value.__code__.co_filename):
            out.append(value)
    return out


def _user_code(filename: str) -> bool:
    """Kernel-side Python: this project's kernels, or code outside the simulator, installed
    packages and the standard library."""
    path = os.path.realpath(filename)
    if path.startswith(_SIMULATOR):
        return False
    if path.startswith(_KERNELS):
        return True
    return not path.startswith(_INSTALLED)


_SIMULATOR = os.path.dirname(os.path.realpath(__file__)) + os.sep
_PARENT = os.path.dirname(_SIMULATOR.rstrip(os.sep))    # installed: nki_kernels/simulate
_KERNELS = (_PARENT if os.path.basename(_PARENT) == "nki_kernels"
            else os.path.join(_PARENT, "nki_kernels")) + os.sep
_INSTALLED = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                   for k in ("stdlib", "purelib", "platlib"))


def check_argument(value, where: str) -> None:
    """Raise ``SubsetError`` unless ``value`` is a kind of value NKI kernels take."""
    from .ops import Op
    from .objects import NKIObject
    if value is None or isinstance(value, (bool, str, float, np.floating, np.bool_, np.dtype,
                                           Op, NKIObject, enum.Enum)):
        return
    if isinstance(value, (int, np.integer)):
        if not INT32[0] <= int(value) <= INT32[1]:
            raise SubsetError(f"{where}={int(value)} does not fit in 32 bits (NKI integers are "
                              f"32-bit); pass it as device data", op="nki.jit", operand=where)
        return
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            check_argument(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise SubsetError(f"{where}: dict key {k!r} is not a string (NKI dicts take "
                                  f"string keys only)", op="nki.jit", operand=where)
            check_argument(v, f"{where}[{k!r}]")
        return
    if _is_tensor(value) or callable(value):          # functions (inlined), classes, kernels
        return
    raise SubsetError(f"{where}: a {type(value).__name__} is not a value NKI kernels take "
                      f"(tensors, numbers, strings, None, dtypes, tuples, dicts with string "
                      f"keys, NKIObject or Enum instances, functions)", op="nki.jit",
                      operand=where)


def _is_tensor(value) -> bool:
    from .tensor import ndarray
    return (isinstance(value, (np.ndarray, ndarray))
            or (type(value).__module__.startswith(("torch", "jax")) and hasattr(value, "shape")))
