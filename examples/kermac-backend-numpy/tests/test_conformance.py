"""kermac's conformance suite on the numpy backend (install the package first: `pip install .[test]`).

Problems the backend refuses (gradients, half dtypes) are skipped with its reason."""

from kermac.testing import conformance_tests

globals().update(conformance_tests("numpy", devices=["cpu"]))
