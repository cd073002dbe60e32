"""The interface every kermac backend implements.

A backend is an object registered through the `kermac.backends` entry-point group (see
[`kermac.hookspecs`][kermac.hookspecs]).  Core normalises every call into a problem object
(`kermac.problem.PairwiseProblem`, `kermac.problem.GradProblem`, `kermac.problem.ProductProblem` or
`kermac.problem.ProductGradProblem`) and hands it to
the best-ranked backend that is available and supports it
([`kermac.registry.select_backend`][kermac.registry.select_backend]). Backends write into `problem.out`; they never
allocate other memory except documented workspaces, and never synchronise with the host.

Importing the module that defines a backend class must be cheap: heavy dependencies (triton,
cuda-core, ...) are imported inside [`Backend.availability`][kermac.backend.Backend.availability] and the run methods.

The contract grows without breaking plugins: an operation added after the first release (the fused
product, [`check_product`][kermac.backend.Backend.check_product] / [`product`][kermac.backend.Backend.product], and its
gradient, [`check_product_grad`][kermac.backend.Backend.check_product_grad] /
[`product_grad`][kermac.backend.Backend.product_grad], and gradient programs in the general form,
[`check_general_grad`][kermac.backend.Backend.check_general_grad] /
[`general_grad`][kermac.backend.Backend.general_grad]) arrives with a default that refuses it, so a backend written
before it keeps loading and simply is not chosen for that operation; a backend opts in by overriding both
methods.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from kermac.problem import GradProblem, PairwiseProblem, ProductGradProblem, ProductProblem

__all__ = ["Availability", "Backend"]


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run at all on this machine, and why not."""

    available: bool
    reason: str | None = None
    version: str | None = None

    @classmethod
    def yes(cls, version: str | None = None) -> Availability:
        return cls(True, None, version)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason, None)


class Backend(abc.ABC):
    """Base class of kermac backends.

    Subclasses set `name` (what users pass as `backend=`: letters, digits, `_`, `-`,
    `.`; not `auto` nor a built-in name of [`kermac.hookspecs.RESERVED`][kermac.hookspecs.RESERVED]) and
    `priority` (an int; where no cost table ranks it, `auto` tries higher priorities first;
    a negative priority marks an opt-in backend, e.g. an emulator, that `auto` never picks and
    `kermac bench` does not time unless named), and implement the methods below.

    The hooks `priority`, [`availability`][kermac.backend.Backend.availability],
    [`preference`][kermac.backend.Backend.preference], [`check_pairwise`][kermac.backend.Backend.check_pairwise],
    [`check_grad`][kermac.backend.Backend.check_grad],
    [`check_general_grad`][kermac.backend.Backend.check_general_grad],
    [`check_product`][kermac.backend.Backend.check_product] and
    [`check_product_grad`][kermac.backend.Backend.check_product_grad] must not raise and must return the
    documented types; one that does not is a plugin error, which [`kermac.registry`][kermac.registry] reports once
    and survives (`auto` skips the backend for that decision).
    [`kermac.testing.assert_pairwise_conforms`][kermac.testing.assert_pairwise_conforms] and
    [`assert_grad_conforms`][kermac.testing.assert_grad_conforms] check a backend's values against the reference.
    """

    name: ClassVar[str]
    priority: ClassVar[int] = 0
    description: ClassVar[str] = ""

    @abc.abstractmethod
    def availability(self) -> Availability:
        """Whether this backend can run on this machine.  Must not raise; kermac asks once per process."""

    @abc.abstractmethod
    def check_pairwise(self, problem: PairwiseProblem) -> str | None:
        """`None` if [`pairwise`][kermac.backend.Backend.pairwise] can run `problem`, else the reason it cannot (a
        str)."""

    @abc.abstractmethod
    def pairwise(self, problem: PairwiseProblem) -> None:
        """Compute the fused pairwise kernel of `problem` into `problem.out` (every element of it)."""

    @abc.abstractmethod
    def check_grad(self, problem: GradProblem) -> str | None:
        """`None` if [`grad`][kermac.backend.Backend.grad] can run `problem`, else the reason it cannot (a str)."""

    @abc.abstractmethod
    def grad(self, problem: GradProblem) -> None:
        """Compute the gradient contraction of `problem` into `problem.out` (every element of it)."""

    def check_general_grad(self, problem: GradProblem) -> str | None:
        """`None` if [`general_grad`][kermac.backend.Backend.general_grad] can run `problem`, a gradient contraction
        whose program is in the general form (`problem.program.accumulate` is set: any multiply, accumulation and
        reduction; [`kermac.programs.GradProgram`][kermac.programs.GradProgram]), else the reason it cannot.

        Not abstract: the default refuses, so that a backend written for the product form only is never handed a
        general program (it would read `program.multiply` as the factor of `c·a·multiply`)."""
        return f"backend {self.name!r} computes gradient programs in the product form Σ_k c·a·g(d, b) only"

    def general_grad(self, problem: GradProblem) -> None:
        """Compute the gradient contraction of a program in the general form into `problem.out` (every element of
        it).  The default raises `NotImplementedError` (kermac only calls it after
        [`check_general_grad`][kermac.backend.Backend.check_general_grad] accepted)."""
        raise NotImplementedError(self.check_general_grad(problem))

    def check_product(self, problem: ProductProblem) -> str | None:
        """`None` if [`product`][kermac.backend.Backend.product] can run `problem`, else the reason it cannot (a str).

        Not abstract: the default refuses, so that backends written before the fused product existed keep
        loading (the contract's versioning rule: a new operation arrives with a refusing default)."""
        return f"backend {self.name!r} does not compute fused kernel products"

    def product(self, problem: ProductProblem) -> None:
        """Compute `problem.out = K @ v` (`kermac.problem.ProductProblem`: every element of it)
        without materialising K beyond documented workspaces.  The default raises `NotImplementedError`
        (kermac only calls it after [`check_product`][kermac.backend.Backend.check_product] accepted)."""
        raise NotImplementedError(f"backend {self.name!r} does not compute fused kernel products")

    def check_product_grad(self, problem: ProductGradProblem) -> str | None:
        """`None` if [`product_grad`][kermac.backend.Backend.product_grad] can run `problem`, else the reason it cannot
        (a str).  Not abstract: the default refuses (the versioning rule of
        [`check_product`][kermac.backend.Backend.check_product])."""
        return f"backend {self.name!r} does not compute gradients of fused kernel products"

    def product_grad(self, problem: ProductGradProblem) -> None:
        """Compute the gradient product of `problem` (`kermac.problem.ProductGradProblem`) into `problem.out` (every
        element of it) without materialising K or its derivative beyond documented workspaces.  The default raises
        `NotImplementedError` (kermac only calls it after
        [`check_product_grad`][kermac.backend.Backend.check_product_grad] accepted)."""
        raise NotImplementedError(f"backend {self.name!r} does not compute gradients of fused kernel products")

    def preference(self, problem: PairwiseProblem | GradProblem | ProductProblem | ProductGradProblem) -> int:
        """How strongly `auto` should prefer this backend for `problem` (default: `priority`).

        `auto` ranks first the backends that the cost table of the problem's device lists for
        its class ([`kermac.costs`][kermac.costs]), cheapest first, then the others by this value (ties go
        to the higher priority), and runs the first that accepts; so this is asked of every
        available backend the table does not list, also for problems it will refuse. Where no
        table covers the device or class, this order alone decides: a backend may override it
        for a class of problems it has measured itself faster on; it must be cheap and must not
        raise. Backends of negative priority stay opt-in whatever this returns.
        """
        return self.priority

    def precompile(
        self, problems: list[PairwiseProblem | GradProblem], *, archs: Sequence[str] | None = None
    ) -> list[str]:
        """Compile ahead of time whatever running `problems` would compile; names what was built.

        `archs` names target architectures (e.g. `"sm_90"`) where the problems' device does
        not (`kermac precompile` builds problems on the `meta` device when there is no GPU).
        Backends that compile nothing ahead of time keep this default.
        """
        return []

    def __repr__(self) -> str:
        return f"<kermac backend {self.name!r}>"
