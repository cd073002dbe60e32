"""CUDA-graph capture and replay of every sample call on both GPU backends (`pytest -m gpu`):
warm up, capture into a preallocated `out`, change the inputs (and the tensor hyperparameters) in
place, replay, and compare with a fresh eager call."""

from __future__ import annotations

import pytest
import torch
from helpers import require_backend
from op_samples import samples

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["nvrtc", "triton"])
@pytest.mark.parametrize("index", range(len(samples("cpu"))), ids=[s.name for s in samples("cpu")])
def test_capture_and_replay(backend: str, index: int) -> None:
    sample = samples("cuda", torch.float32)[index]
    require_backend(backend, "cuda", sample.op)
    inputs = tuple(t.clone() for t in sample.inputs)
    out = torch.empty_like(sample(*inputs, backend=backend))

    def call() -> None:
        sample(*inputs, backend=backend, out=out)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # warm-up on the capture stream: compiles (and autotunes) before the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for step in range(3):
        gen = torch.Generator(device="cuda").manual_seed(step)
        for t in inputs[: sample.operands]:
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda"))
        for t in inputs[sample.operands :]:
            t.mul_(1.25)  # batched hyperparameters held in device tensors
        graph.replay()
        torch.cuda.synchronize()
        expected = sample(*inputs, backend=backend)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
