"""`kermac.first_call`: a variant's first call timed in a fresh process (CPU, the reference backend)."""

from __future__ import annotations

import os

import pytest

from kermac.first_call import FirstCallTimes, precompile_into, private_caches, time_first_call


def test_a_child_times_its_import_loading_and_calls_with_its_caches_where_named() -> None:
    with private_caches() as caches:
        t = time_first_call("torch", "gaussian", (8, 3), "cpu", caches)
        assert isinstance(t, FirstCallTimes)
        assert t.import_s > 1e-3 and t.load_s > 0 and t.first_s > 0 and t.second_s > 0  # kermac imported in the child
    assert not os.path.exists(caches)


def test_a_failing_child_is_named_with_its_error() -> None:
    with private_caches() as caches, pytest.raises(RuntimeError, match=r"(?s)torch p_x: the child process failed.*p_x"):
        time_first_call("torch", "p_x", (8, 3), "cpu", caches)


def test_private_caches_copy_what_they_start_from(tmp_path) -> None:
    (tmp_path / "kermac").mkdir()
    (tmp_path / "kermac" / "entry").write_text("cubin")
    with private_caches(str(tmp_path)) as caches:
        assert open(os.path.join(caches, "kermac", "entry")).read() == "cubin"
        assert oct(os.stat(caches).st_mode & 0o777) == "0o700"  # mkdtemp: the user's alone
    assert (tmp_path / "kermac" / "entry").exists()


def test_precompile_into_runs_kermac_precompile_and_names_its_failure() -> None:
    with private_caches() as caches:
        assert precompile_into("torch", caches) > 0  # the reference backend compiles nothing, and says so
    with private_caches() as caches, pytest.raises(RuntimeError, match="nope: kermac precompile failed"):
        precompile_into("nope", caches)
