"""The NKI front-end's subset beyond the language guide: loop targets and loop ``else`` refused
(deployed NKI says "expecting simple variable"), the constructs its public source has no form
for warned of once per kernel and refused under ``NKI_SIM_SUBSET=strict``, and classes a kernel
builds held to the NKIObject / Enum / NamedTuple rule."""

import importlib.util
import inspect
import warnings
from typing import NamedTuple

import numpy as np
import pytest

from nki_kernels.simulate import jit, nisa, nl
from nki_kernels.simulate.subset import SubsetError, SubsetWarning

from .isa_util import copy_through_sbuf

X = np.arange(16, dtype=np.float32).reshape(4, 4)


_copy = copy_through_sbuf

pytestmark = pytest.mark.usefixtures("fresh_subset_checks")


@jit
def _unpacks_in_a_for(x):
    for name, rows in (("a", 1), ("b", 2)):
        pass
    return _copy(x)


@jit
def _unpacks_in_a_comprehension(x):
    sizes = [rows for _, rows in (("a", 1), ("b", 2))]
    return _copy(x), sizes[0]


@jit
def _for_else(x):
    for _ in range(2):
        pass
    else:
        pass
    return _copy(x)


@jit
def _while_else(x):
    n = 0
    while n < 2:
        n += 1
    else:
        pass
    return _copy(x)


@pytest.mark.parametrize("kernel, what", [
    (_unpacks_in_a_for, "expecting simple variable"),
    (_unpacks_in_a_comprehension, "expecting simple variable"),
    (_for_else, "else on a loop"), (_while_else, "else on a loop"),
])
def test_what_deployed_nki_refuses_is_refused_with_the_line(kernel, what):
    with pytest.raises(SubsetError, match=what) as err:
        kernel(X)
    assert "test_python_subset_frontend.py:" in str(err.value)


# One kernel per flagged construct, each in a module file of its own (the check reads the
# source and is cached per function and mode).
def _flagged_kernel(body, where):
    """A kernel whose body is ``body`` (then ``return _copy(x)``), loaded from a file in
    ``where``."""
    path = where / f"flagged_{len(list(where.iterdir()))}.py"
    path.write_text("from nki_kernels.simulate import nisa, nl\n"
                    "from tests.simulate.isa_util import copy_through_sbuf as _copy\n\n\n"
                    f"def kernel(x):\n{body}    return _copy(x)\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel


FLAGGED = {
    "lambda": "    f = lambda v: v\n",
    "list comprehensions": "    rows = [r for r in range(2)]\n",
    "dict comprehensions": "    rows = {'a': r for r in range(2)}\n",
    "generator expressions": "    n = sum(r for r in range(2))\n",
    "raise": "    if x.shape[0] > 99:\n        raise ValueError('too big')\n",
    "del": "    rows = {'a': 1}\n    del rows['a']\n",
    "\\*-expansion": "    rows = [*range(2)]\n",
    "\\*\\*-expansion": "    opts = {'a': 1}\n    dict(**opts)\n",
    "dict displays with keys other than string constants": "    rows = {1: 2}\n",
    "a class defined inside a function": "    class Inner(nl.NKIObject):\n        pass\n",
    "import inside a function": "    import math\n",
}


def test_flagged_constructs_warn_once_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("NKI_SIM_SUBSET", raising=False)
    for what, body in FLAGGED.items():
        kernel = jit(_flagged_kernel(body, tmp_path))
        with pytest.warns(SubsetWarning, match=what):
            np.testing.assert_array_equal(kernel(X), X)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kernel(X)                          # once per kernel: the second launch is silent


def test_flagged_constructs_are_refused_in_strict_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("NKI_SIM_SUBSET", "strict")
    for what, body in FLAGGED.items():
        kernel = jit(_flagged_kernel(body, tmp_path))
        with pytest.raises(SubsetError, match=f"{what}.*NKI_SIM_SUBSET=strict"):
            kernel(X)


def test_the_warning_counts_every_flagged_site(monkeypatch, tmp_path):
    monkeypatch.delenv("NKI_SIM_SUBSET", raising=False)
    kernel = jit(_flagged_kernel("    f = lambda v: v\n    rows = [r for r in range(2)]\n",
                                 tmp_path))
    with pytest.warns(SubsetWarning, match=r"\(and 1 more\)"):
        kernel(X)


def _loop_body_kernel(x, n):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)

    def body(i):                               # the documented fori_loop form: an inner function
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    nl.fori_loop(0, n, body)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_the_documented_loop_body_passes_strict_mode(monkeypatch):
    monkeypatch.setenv("NKI_SIM_SUBSET", "strict")
    np.testing.assert_array_equal(jit(_loop_body_kernel)(X, 3), X + 3)


class _Plain:
    def __init__(self, rows):
        self.rows = rows


class _Tuple(NamedTuple):
    rows: int


class _Object(nl.NKIObject):
    rows = 2


@jit
def _builds_a_plain_class(x):
    return _copy(x), _Plain(2).rows


@jit
def _builds_nki_classes(x):
    return _copy(x), _Tuple(2).rows + _Object().rows


def test_a_class_the_kernel_builds_must_be_an_nki_class():
    with pytest.raises(SubsetError, match="builds a _Plain, a class that does not derive from "
                                          "NKIObject") as err:
        _builds_a_plain_class(X)
    assert "test_python_subset_frontend.py:" in str(err.value)
    out, rows = _builds_nki_classes(X)
    np.testing.assert_array_equal(out, X)
    assert rows == 4


def _kernel_calling_helper(helper, where):
    """The same kernel source each call (equal code objects, though in two files), bound to
    ``helper``."""
    path = where / f"calls_helper_{len(list(where.iterdir()))}.py"
    path.write_text("def kernel(x):\n    return helper(x)\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.helper = helper
    return module.kernel


def _helper_with_a_lambda(x):
    f = lambda v: v  # noqa: E731  (flagged on purpose)
    return f(_copy(x))


def test_equal_kernel_code_with_other_helpers_is_checked_again(monkeypatch, tmp_path):
    """Two kernels of identical source compare equal as code objects; the second, whose helper
    uses a lambda, must still be checked (the check was cached by code equality)."""
    monkeypatch.setenv("NKI_SIM_SUBSET", "strict")
    first, second = (_kernel_calling_helper(h, tmp_path) for h in (_copy, _helper_with_a_lambda))
    assert first.__code__ == second.__code__
    np.testing.assert_array_equal(jit(first)(X), X)
    with pytest.raises(SubsetError, match="in helper _helper_with_a_lambda.*lambda"):
        jit(second)(X)


def _line_of(fn, text):
    """File line of the first source line of ``fn`` holding ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_a_refusal_names_op_kernel_and_exact_line():
    with pytest.raises(SubsetError) as err:
        _unpacks_in_a_for(X)
    assert err.value.op == "nki.jit"
    line = _line_of(_unpacks_in_a_for, "for name")
    assert err.value.location == f"test_python_subset_frontend.py:{line}"
    assert err.value.detail.startswith("kernel _unpacks_in_a_for: a for target")


def test_a_strict_refusal_and_a_warning_name_the_exact_line(monkeypatch, tmp_path):
    body = "    rows = 1\n    f = lambda v: v\n"
    monkeypatch.setenv("NKI_SIM_SUBSET", "strict")
    kernel = _flagged_kernel(body, tmp_path)
    with pytest.raises(SubsetError) as err:
        jit(kernel)(X)
    where = f"{kernel.__code__.co_filename.rsplit('/', 1)[-1]}:7"      # def on line 5
    assert err.value.op == "nki.jit" and err.value.location == where
    assert err.value.detail == ("kernel kernel: lambda: the NKI front-end's public source has no "
                                "form for this [NKI_SIM_SUBSET=strict]")
    monkeypatch.delenv("NKI_SIM_SUBSET")
    with pytest.warns(SubsetWarning) as seen:
        jit(_flagged_kernel(body, tmp_path))(X)
    text = str(seen[0].message)
    assert text.startswith("flagged_1.py:7: kernel kernel: lambda") and "more)" not in text
    assert seen[0].filename == __file__          # points at the launch in the caller's code


class _WithAMethod(NamedTuple):
    rows: int

    def doubled(self):
        return [2 * r for r in range(self.rows)]


@jit
def _builds_a_tuple_with_a_flagged_method(x):
    return _copy(x), _WithAMethod(2).rows


def _closure_kernel():
    def helper(x):
        try:
            return _copy(x)
        except ValueError:
            return None

    def kernel(x):
        return helper(x)
    return kernel


def test_methods_of_built_classes_and_closure_helpers_are_checked(monkeypatch):
    monkeypatch.setenv("NKI_SIM_SUBSET", "strict")
    with pytest.raises(SubsetError, match="in helper doubled, which it calls.*list comprehensions"):
        _builds_a_tuple_with_a_flagged_method(X)
    with pytest.raises(SubsetError, match="in helper helper, which it calls.*try/except"):
        jit(_closure_kernel())(X)


def test_only_the_exact_strict_value_is_strict(monkeypatch, tmp_path):
    monkeypatch.setenv("NKI_SIM_SUBSET", "STRICT")              # case-insensitive
    with pytest.raises(SubsetError):
        jit(_flagged_kernel("    f = lambda v: v\n", tmp_path))(X)
    monkeypatch.setenv("NKI_SIM_SUBSET", "yes")
    with pytest.warns(SubsetWarning):
        jit(_flagged_kernel("    f = lambda v: v\n", tmp_path))(X)
