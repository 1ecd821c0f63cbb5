"""The simulator stands in for `import nki`: an unmodified Beta 2 kernel file runs on the CPU."""

import importlib
import sys
import types

import numpy as np
import pytest

from nki_kernels import simulate


def test_foreign_kernel_runs_unchanged(rng):
    with simulate.patched():
        sys.modules.pop("examples.foreign_kernels.rmsnorm_rows", None)
        mod = importlib.import_module("examples.foreign_kernels.rmsnorm_rows")
        x = rng.standard_normal((300, 77)).astype(np.float32)
        y = mod.rmsnorm_rows(x, 1e-6)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    assert "nki" not in sys.modules or not getattr(sys.modules["nki"], "__nki_kernels_simulator__", False)


def test_nl_convenience_ops(rng):
    from nki_kernels.simulate import jit, nl

    @jit
    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        z = nl.add(nl.exp(x), y)
        s = nl.softmax(z)
        m = nl.matmul(x, nl.load(b[:, 0:8]), transpose_x=True)     # [F, 8] = x^T @ b[:, :8]
        out = nl.ndarray(s.shape, s.dtype, buffer=nl.shared_hbm)
        nl.store(out, s)
        out2 = nl.ndarray(m.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out2, m)
        return out, out2
    a = rng.standard_normal((16, 24)).astype(np.float32)
    b = rng.standard_normal((16, 24)).astype(np.float32)
    s, m = k(a, b)
    z = np.exp(a) + b
    want = np.exp(z - z.max(1, keepdims=True))
    np.testing.assert_allclose(s, want / want.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(m, a.T @ b[:, :8], rtol=1e-4, atol=1e-5)


def test_backend_treats_pypi_placeholder_as_absent(monkeypatch):
    from nki_kernels import backend
    placeholder = types.ModuleType("nki")           # the PyPI 'nki' 0.0.1 has no jit
    monkeypatch.setitem(sys.modules, "nki", placeholder)
    monkeypatch.setitem(sys.modules, "nki.language", types.ModuleType("nki.language"))
    monkeypatch.setitem(sys.modules, "nki.isa", types.ModuleType("nki.isa"))
    assert backend._real_nki() is None
    assert backend._select()[0] == "sim"
    monkeypatch.setenv(backend.BACKEND_ENV, "nki")
    with pytest.raises(ImportError, match="placeholder"):
        backend._select()


def test_nki_simulator_env_forces_the_simulator_over_a_real_nki(monkeypatch):
    from nki_kernels import backend
    fake = types.ModuleType("nki")                  # looks genuine: has jit
    fake.jit = lambda f: f
    fake.language, fake.isa = types.ModuleType("nki.language"), types.ModuleType("nki.isa")
    monkeypatch.setitem(sys.modules, "nki", fake)
    monkeypatch.setitem(sys.modules, "nki.language", fake.language)
    monkeypatch.setitem(sys.modules, "nki.isa", fake.isa)
    assert backend._select()[0] == "nki"
    monkeypatch.setenv("NKI_SIMULATOR", "1")
    assert backend._select()[0] == "sim"


def test_nki_typing_tensor_annotates_kernel_parameters():
    """The average-pool tutorial's ``from nki.typing import tensor`` (the language guide's
    ``def kernel(x: tensor)``) imports, and the annotation is the tensor class."""
    from nki_kernels import simulate
    from nki_kernels.simulate.tensor import ndarray
    with simulate.patched():
        from nki.typing import tensor
        import nki
        import nki.isa as nisa
        import nki.language as nl

        @nki.jit
        def copy(a: tensor) -> tensor:
            assert isinstance(a, tensor)
            t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=t)
            return out

        x = np.arange(4, dtype=np.float32).reshape(2, 2)
        assert tensor is ndarray
        assert np.array_equal(copy(x), x)
