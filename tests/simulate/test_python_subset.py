"""The NKI Python subset: constructs and arguments the real compiler refuses are refused here."""

import enum

import numpy as np
import pytest

from nki_kernels.simulate import jit, nisa, nl
from nki_kernels.simulate.subset import SubsetError

from .isa_util import copy_through_sbuf

X = np.zeros((4, 4), np.float32)


_copy = copy_through_sbuf

pytestmark = pytest.mark.usefixtures("fresh_subset_checks")


@jit
def _uses_a_set(x):
    sizes = {n for n in (1, 2, 2)}
    return _copy(x), len(sizes)


@jit
def _uses_try(x):
    try:
        return _copy(x)
    except ValueError:
        return None


@jit
def _uses_global(x):
    global X
    return _copy(x)


@jit
def _defines_a_plain_class(x):
    class Tile:
        rows = 4
    return _copy(x)


@jit
def _yields(x):
    yield _copy(x)


@pytest.mark.parametrize("kernel, what", [
    (_uses_a_set, "set comprehensions"), (_uses_try, "try/except"), (_uses_global, "global"),
    (_defines_a_plain_class, "class Tile must derive from NKIObject"), (_yields, "yield"),
])
def test_constructs_outside_the_subset_are_refused_with_the_line(kernel, what):
    with pytest.raises(SubsetError, match=what) as err:
        kernel(X)
    assert "test_python_subset.py:" in str(err.value)


class Mode(enum.Enum):
    fast = 1
    exact = 2


class Config(nl.NKIObject):
    rows = 4


@jit
def _takes_everything(x, scale, mode, cfg, table, fn, op, dtype, name=None):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    fn(t, op, scale * table["k"] * cfg.rows * (2 if mode == Mode.exact else 1))
    out = nl.ndarray(x.shape, dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _scale_by(t, op, value):
    nisa.tensor_scalar(dst=t, data=t, op0=op, operand0=float(value))


def test_documented_argument_kinds_are_accepted():
    out = _takes_everything(np.ones((4, 4), np.float32), 0.5, Mode.exact, Config(), {"k": 3},
                            _scale_by, nl.multiply, nl.float32, name="x")
    np.testing.assert_array_equal(out, np.full((4, 4), 0.5 * 3 * 4 * 2, np.float32))


@pytest.mark.parametrize("bad, match", [
    (2**40, "does not fit in 32 bits"), ({1: 2}, "is not a string"),
    (object(), "a object is not a value NKI kernels take"), ((1, 2**33), r"scale\[1\]"),
])
def test_arguments_outside_the_subset_are_refused_by_name(bad, match):
    with pytest.raises(SubsetError, match=match):
        _takes_everything(X, bad, Mode.fast, Config(), {"k": 1}, _scale_by, nl.multiply,
                          nl.float32)


def test_nkiobject_classes_derive_from_nkiobject_only():
    class Other:
        pass
    with pytest.raises(SubsetError, match="derives from Other"):
        class Mixed(nl.NKIObject, Other):
            pass

    class Derived(Config):                       # NKIObject subclasses of subclasses are fine
        cols = 2
    assert Derived().cols == 2


def _helper_with_try(x):
    try:
        return _copy(x)
    except ValueError:
        return None


def _helper_calling_a_bad_one(x):
    return _helper_with_try(x)


class _Helpers:
    @staticmethod
    def copy_with_a_set(x):
        return _copy(x), len({1, 2})


@jit
def _calls_a_bad_helper_two_levels_down(x):
    return _helper_calling_a_bad_one(x)


@jit
def _calls_a_static_method_with_a_set(x):
    return _Helpers.copy_with_a_set(x)


@jit
def _calls_clean_helpers(x):
    return _copy(x)


@pytest.mark.parametrize("kernel, helper, what", [
    (_calls_a_bad_helper_two_levels_down, "_helper_with_try", "try/except"),
    (_calls_a_static_method_with_a_set, "copy_with_a_set", "set displays")])
def test_helpers_the_kernel_calls_are_checked_too(kernel, helper, what):
    """The real compiler inlines helpers, so their Python must be in the subset as well: the
    refusal names the kernel, the helper and the helper's line."""
    with pytest.raises(SubsetError, match=f"in helper {helper}, which it calls.*{what}") as err:
        kernel(X)
    assert "test_python_subset.py:" in str(err.value)
    np.testing.assert_array_equal(_calls_clean_helpers(X), X)
