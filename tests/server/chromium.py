"""Debian's Chromium driven by Playwright: the browser tests and scripts/screenshots.py use
it. No browser is ever downloaded (no ``playwright install``): ``make test`` installs the
``chromium`` package with ``scripts/ensure-chromium``."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, Playwright

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright: Playwright) -> Browser:
    if not CHROMIUM.exists():
        raise RuntimeError("no /usr/bin/chromium: run scripts/ensure-chromium (make test does)")
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
