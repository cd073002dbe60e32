"""The reference backend `torch`: pure PyTorch, any device and dtype, the oracle of the tests.

It evaluates core's IR with torch operations in memory-bounded chunks (never an M·N·D
intermediate), accumulating in float32 for half-precision inputs and float64 for float64.
It is registered through the `kermac.backends` entry point like any third-party backend.
"""
