"""tests/ui's modules share one served app: an app takes some 10 s to start on a 2-core machine,
and each test opens its own pages (so its own Gradio sessions) on it, as a Space's visitors do
one after another. The slide walk has its own (tests/ui/test_slides_browser.py): it measures
every page and should not depend on what the other modules left in the server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import serve_app


@pytest.fixture(scope="package")
def served_app() -> Iterator[str]:
    yield from serve_app()
