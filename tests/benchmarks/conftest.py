import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a machine shared with other jobs, two spinning threads can take 10x longer."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
