from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.leftovers import no_process_left


@pytest.fixture(scope="package", autouse=True)
def no_watch_process_left() -> Iterator[str]:
    """After the watch tests, no watcher, job, server or client they started still runs."""
    yield from no_process_left()
