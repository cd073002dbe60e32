"""Conformance checks a backend -- kermac's own or a third party's -- must pass.

Every check runs a program on the backend under test into an `out` *poisoned* with NaN, and
compares it with the reference backend (`torch`, whose name no plugin may take) evaluated on
the inputs upcast to float64.  A backend that leaves part of `out` unwritten fails: the poison
shows where the reference has a number.  Entries must agree in their NaN and infinite values and
otherwise within `rtol` relative to the largest finite reference entry ([`TOLERANCE`][kermac.testing.TOLERANCE]
by dtype).

**The suite.** [`conformance_tests`][kermac.testing.conformance_tests] turns a backend name into pytest
tests; a plugin's test file needs two lines (pytest is imported only then):

```text
from kermac.testing import conformance_tests

globals().update(conformance_tests("mybackend", devices=["cpu"]))
```

They check that the registry lists the backend and `backend="mybackend"` (and `KERMAC_BACKEND`)
reaches it, that its hooks return the documented types, and, for every problem of
[`CASES`][kermac.testing.CASES] (every preset, user programs -- among them a max of negative and a
min of positive terms, which only the reduction's identity gets right, and a log-sum-exp soft minimum
([`SOFT_MIN`][kermac.testing.SOFT_MIN]) -- and the gradient programs, in the product form and the general
form with each reduction ([`MAX_GRAD`][kermac.testing.MAX_GRAD], [`MIN_GRAD`][kermac.testing.MIN_GRAD],
[`SOFT_MAX_GRAD`][kermac.testing.SOFT_MAX_GRAD], [`GENERAL_SUM_GRAD`][kermac.testing.GENERAL_SUM_GRAD]),
on sizes that are not tile multiples, sizes larger than any tile in every dimension, size-0 and
size-1 dimensions, transposed and strided views, broadcast batches, batched tensor hyperparameters,
NaN and infinite inputs), that `check_pairwise`
/ `check_grad` answer honestly: a problem the backend accepts runs and matches the reference, one
it refuses comes with a reason (a non-empty str), which `backend=` quotes in its
`UnsupportedProblemError`, and is skipped with it.  The same holds for `check_product` / `product`
on the kernel products `K @ v` of the pairwise cases of [`PRODUCT_CASES`][kermac.testing.PRODUCT_CASES]
(`v` of 1 and 5 columns) and the transposed product `Kᵀ @ u` of
[`TRANSPOSED_PRODUCT_CASE`][kermac.testing.TRANSPOSED_PRODUCT_CASE]: a backend that predates products
refuses them by default ([`kermac.backend.Backend.check_product`][kermac.backend.Backend.check_product]) and
passes with those tests skipped; one that claims a product must compute it, or fails.  On CUDA the
backend also runs each problem without synchronising with the host
(`torch.cuda.set_sync_debug_mode("error")`).
A backend that is unavailable on this machine, or a device that is not, skips its tests with the
reason (fails them, with `required=True`).

**Single checks.** [`assert_pairwise_conforms`][kermac.testing.assert_pairwise_conforms] and
[`assert_grad_conforms`][kermac.testing.assert_grad_conforms] and
[`assert_product_conforms`][kermac.testing.assert_product_conforms] compare one call on given inputs:

```text
from kermac import presets, testing

testing.assert_pairwise_conforms("mybackend", presets.l1_distance.lower(), x, z)
```

The checks synchronise with the host (they are tests, not a hot path).

The package's modules: `values` (one call against the reference), `cases` (the table of
problems), `hooks` (the registry's view of a backend and its hooks' answers), `case_check` (one
case on one backend) and `suite` (the pytest entry point); every name above is importable from
`kermac.testing`.
"""

from kermac.testing.case_check import check_case, check_product_case
from kermac.testing.cases import (
    CASES,
    GENERAL_SUM_GRAD,
    HUBER_GRAD,
    HYPER_VALUES,
    LAYOUTS,
    LOPSIDED_RIDGE,
    MAX_GRAD,
    MAX_OF_NEGATIVES,
    MIN_GRAD,
    MIN_OF_POSITIVES,
    PRODUCT_CASES,
    PRODUCT_COLUMNS,
    SOFT_L1,
    SOFT_MAX_GRAD,
    SOFT_MIN,
    TRANSPOSED_PRODUCT_CASE,
    Case,
)
from kermac.testing.hooks import backend_names, check_hooks, check_registry, unusable_reason
from kermac.testing.suite import conformance_tests
from kermac.testing.values import (
    GRAD_INF_MAY_BE_NAN,
    TOLERANCE,
    assert_grad_conforms,
    assert_matches_reference,
    assert_pairwise_conforms,
    assert_product_conforms,
    product_rtol,
    product_scale,
)

__all__ = [
    "CASES",
    "GENERAL_SUM_GRAD",
    "GRAD_INF_MAY_BE_NAN",
    "HUBER_GRAD",
    "HYPER_VALUES",
    "LAYOUTS",
    "LOPSIDED_RIDGE",
    "MAX_GRAD",
    "MAX_OF_NEGATIVES",
    "MIN_GRAD",
    "MIN_OF_POSITIVES",
    "PRODUCT_CASES",
    "PRODUCT_COLUMNS",
    "SOFT_L1",
    "SOFT_MAX_GRAD",
    "SOFT_MIN",
    "TOLERANCE",
    "TRANSPOSED_PRODUCT_CASE",
    "Case",
    "assert_grad_conforms",
    "assert_matches_reference",
    "assert_pairwise_conforms",
    "assert_product_conforms",
    "backend_names",
    "check_case",
    "check_hooks",
    "check_product_case",
    "check_registry",
    "conformance_tests",
    "product_rtol",
    "product_scale",
    "unusable_reason",
]
