import pytest

from tests.conftest import torch_threads


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a machine shared with other jobs, two spinning threads can take 10x longer."""
    with torch_threads(1):
        yield
