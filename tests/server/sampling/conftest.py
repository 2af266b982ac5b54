import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def one_cpu_thread():
    """These tensors are tiny: intra-op threads only add wake-up latency, badly so on a shared machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
