"""The built MkDocs site as a reader sees it: math rendered by the KaTeX copy served with the docs (no CDN), no
escaped pipes left visible, checked in headless Chromium after the page's JavaScript ran."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TRAINER_PAGES = ("magrpo", "maac", "iac", "mappo", "madpo", "marlhf", "iterative")


def _mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python/name tags; only plain keys are read here
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_math_is_rendered_from_local_files():
    config = _mkdocs_config()
    extensions = [e if isinstance(e, str) else next(iter(e)) for e in config["markdown_extensions"]]
    assert "pymdownx.arithmatex" in extensions
    assets = config["extra_javascript"] + config["extra_css"]
    assert any("katex.min.js" in a for a in assets) and any("katex.min.css" in a for a in assets)
    for asset in assets:
        assert "://" not in asset, f"{asset}: served from a CDN, not from docs/"
        assert (DOCS / asset).is_file(), asset
    assert (DOCS / "assets" / "katex" / "LICENSE").is_file()
    assert list((DOCS / "assets" / "katex" / "fonts").glob("KaTeX_Main-Regular.woff2"))


@pytest.mark.parametrize("page", TRAINER_PAGES)
def test_every_trainer_page_writes_its_key_formulas_as_math(page):
    text = (DOCS / f"{page}.md").read_text()
    assert re.search(r"\$\$.+?\$\$", text, re.S) or re.search(r"\$[^$\n]+\$", text), page


def test_no_escaped_pipes_in_docs_tables():
    """MkDocs (Python-Markdown tables) shows `\\|` inside a code span verbatim; GitHub hides the backslash."""
    bad = [
        f"{p.name}:{i}"
        for p in DOCS.glob("*.md")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if line.lstrip().startswith("|") and "\\|" in line
    ]
    assert not bad, bad


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on this machine (.ci/run installs Debian's `chromium`)")


def _browser(chromium: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        chromium,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--virtual-time-budget=10000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)


def _build_site(site: Path) -> None:
    """``mkdocs build --strict``: a broken link or anchor, a page missing from the nav, fails with mkdocs' message."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    warnings = [line for line in result.stderr.splitlines() if not line.startswith("INFO")]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings)


def test_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    _build_site(tmp_path / "site")


@pytest.mark.slow
def test_built_site_renders_math_and_no_raw_pipes_in_chromium(tmp_path):
    chromium = _chromium()
    site = tmp_path / "site"
    _build_site(site)
    for page in TRAINER_PAGES:
        html = (site / page / "index.html").read_text()
        expected = html.count('class="arithmatex"')
        assert expected, f"{page}: no math in the built page"
        dom = _browser(chromium, "--dump-dom", (site / page / "index.html").as_uri()).stdout
        rendered = dom.count('class="katex"')  # one per formula, display or inline, once KaTeX has run
        assert rendered >= expected, f"{page}: {rendered} rendered formulas for {expected} arithmatex elements"
        assert "katex-error" not in dom, f"{page}: KaTeX could not parse a formula"
    dom = _browser(chromium, "--dump-dom", (site / "index.html").as_uri()).stdout
    visible = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    visible = re.sub(r"<[^>]+>", "", visible)
    assert "--baseline" in visible and "\\|" not in visible
    shot = tmp_path / "madpo.png"
    _browser(chromium, f"--screenshot={shot}", "--window-size=1280,1600", (site / "madpo" / "index.html").as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
