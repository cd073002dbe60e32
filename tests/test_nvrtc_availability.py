"""The NVRTC backend's availability without a GPU: what it says where cuda-core, cuda-bindings or NVRTC are missing
or unusable, and the error of a compile that needs cuda-core where it does not import.  `availability()` never
imports cuda.core (tests/test_import.py checks that in a fresh process)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

pytest.importorskip("cuda.bindings")
from kermac_backend_nvrtc import compiler
from kermac_backend_nvrtc.backend import NvrtcBackend


def _find_spec_raising(exc: Exception):
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object):
        if name == "cuda.core":
            raise exc
        return real(name, *args)

    return find_spec


@pytest.mark.parametrize(
    ("found", "reason"),
    [
        (lambda name, *a: None, "cuda-core is not installed; install kermac-backend-nvrtc with its [cu13] extra"),
        (_find_spec_raising(ModuleNotFoundError("No module named 'cuda'")), "cuda-core is not installed; install"),
        (_find_spec_raising(ValueError("cuda.__spec__ is None")), "cuda-core cannot be found (ValueError: cuda.__spec"),
    ],
)
def test_a_missing_cuda_core_is_named(monkeypatch: pytest.MonkeyPatch, found, reason: str) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", found)
    answer = NvrtcBackend().availability()
    assert not answer.available and answer.reason.startswith(reason), answer.reason


def test_cuda_bindings_that_cuda_core_refuses_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import cuda.bindings

    monkeypatch.setattr(cuda.bindings, "__version__", "11.8.0")
    answer = NvrtcBackend().availability()
    assert not answer.available
    assert answer.reason.startswith("cuda-core imports with cuda-bindings 12.x or 13.x, found cuda-bindings 11.8.0; ")


def test_without_a_gpu_the_reason_is_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (13, 0))
    answer = NvrtcBackend().availability()
    assert not answer.available and answer.reason.startswith("no CUDA device is visible to torch")


def test_a_compile_whose_cuda_core_does_not_import_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda.core", None)  # `import cuda.core` raises ImportError
    with pytest.raises(RuntimeError, match=r"compiling k needs cuda-core, which failed to import \(.*\); install "):
        compiler._build('extern "C" __global__ void k() {}', "sm_90", "k", {})


def test_cuda_bindings_that_do_not_import_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import cuda

    monkeypatch.delattr(cuda, "bindings")
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # `from cuda import bindings` raises ImportError
    answer = NvrtcBackend().availability()
    assert not answer.available and answer.reason.startswith("cuda-bindings is not importable (ModuleNotFoundError: ")
