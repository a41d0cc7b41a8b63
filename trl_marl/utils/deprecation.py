"""trl_marl's own deprecation warnings, as classes of their own so that exactly ours can be filtered.

Two kinds, following Python's convention for who should see them:

- `TrlMarlFutureWarning` (a `FutureWarning`, shown by default): a name the user writes goes away in a future
  release, e.g. a trainer argument (`agent_model=`) or a config field (`max_new_tokens`) under a deprecated alias.
- `TrlMarlDeprecationWarning` (a `DeprecationWarning`, shown in `__main__` and in test runs): an import path that
  moved (`trl_marl.team`), which only code, not a command line, can use.

The test suite turns both into errors (`filterwarnings` in pyproject.toml), so that nothing in trl_marl or its tests
uses a deprecated name unnoticed; a test that checks an alias asserts its warning with `pytest.warns`. A user can do
the same for their own code:

    import warnings
    from trl_marl.utils.deprecation import TrlMarlFutureWarning

    warnings.simplefilter("error", TrlMarlFutureWarning)
"""

from __future__ import annotations

import warnings

__all__ = ["TrlMarlDeprecationWarning", "TrlMarlFutureWarning", "warn_deprecated"]


class TrlMarlDeprecationWarning(DeprecationWarning):
    """A trl_marl import path that moved; the old one goes in the next release."""


class TrlMarlFutureWarning(FutureWarning):
    """A trl_marl argument or config name under a deprecated alias; the alias goes in a future release."""


def warn_deprecated(message: str, category: type[Warning] = TrlMarlFutureWarning, *, stacklevel: int = 2) -> None:
    """Warn with one of trl_marl's deprecation classes.

    Args:
        message: what is deprecated and what to use instead.
        category: `TrlMarlFutureWarning` (a name the user writes) or `TrlMarlDeprecationWarning` (an import path).
        stacklevel: as in `warnings.warn`, counted from the function that calls `warn_deprecated`: 2 (the default)
            points at that function's caller.

    Raises:
        TypeError: `category` is not one of the two classes above.
    """
    if category not in (TrlMarlFutureWarning, TrlMarlDeprecationWarning):
        raise TypeError(
            f"category must be TrlMarlFutureWarning or TrlMarlDeprecationWarning, got {getattr(category, '__name__', category)!r}"
        )
    warnings.warn(message, category, stacklevel=stacklevel + 1)
