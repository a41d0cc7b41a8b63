"""trl_marl's own deprecation warnings: their classes, the old import paths, and errors in the test run."""

import importlib
import sys
import warnings

import pytest

from trl_marl import MAGRPOConfig
from trl_marl.utils.deprecation import TrlMarlDeprecationWarning, TrlMarlFutureWarning, warn_deprecated


def test_classes_are_the_standard_categories():
    """Filters on `FutureWarning` / `DeprecationWarning` (a user's, Python's defaults) still apply to ours."""
    assert issubclass(TrlMarlFutureWarning, FutureWarning)
    assert issubclass(TrlMarlDeprecationWarning, DeprecationWarning)


def test_deprecated_names_are_errors_in_the_test_run(tmp_path):
    """pyproject.toml's `filterwarnings` turns ours into errors: a test using an alias without `pytest.warns`
    fails."""
    with pytest.raises(TrlMarlFutureWarning, match="`max_new_tokens` is deprecated"):
        MAGRPOConfig(output_dir=str(tmp_path), max_new_tokens=7, report_to="none")


def test_warn_deprecated_points_at_the_callers_caller():
    def old_api():
        warn_deprecated("old_api is deprecated; use new_api")

    with pytest.warns(TrlMarlFutureWarning, match="use new_api") as record:
        old_api()
    assert record[0].filename == __file__


def test_warn_deprecated_refuses_other_categories():
    with pytest.raises(TypeError, match="category must be TrlMarlFutureWarning or TrlMarlDeprecationWarning"):
        warn_deprecated("x", UserWarning)


def test_moved_module_warns_and_is_the_new_module(monkeypatch):
    monkeypatch.delitem(sys.modules, "trl_marl.zero3", raising=False)
    with pytest.warns(TrlMarlDeprecationWarning, match="trl_marl.zero3 moved to trl_marl.distributed.zero3"):
        old = importlib.import_module("trl_marl.zero3")
    assert old is importlib.import_module("trl_marl.distributed.zero3")


def test_split_module_forwards_each_name_with_a_warning(monkeypatch):
    from trl_marl.models.team import TeamModel

    monkeypatch.delitem(sys.modules, "trl_marl.team", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        team = importlib.import_module("trl_marl.team")  # importing the old path alone does not warn
    with pytest.warns(TrlMarlDeprecationWarning, match="trl_marl.team.TeamModel moved to trl_marl.models.team"):
        assert team.TeamModel is TeamModel
