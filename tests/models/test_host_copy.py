"""host_tensor gives what torch.tensor gives, for every kind of list a step builds."""

import pytest
import torch

from quill.models.host_copy import host_tensor, to_device


@pytest.mark.parametrize("values, dtype", [
    ([3, -1, 2**40], torch.long), ([1, 2], torch.int32), ([0.5, -2, 1e-300], torch.float64),
    ([0.25, 3], torch.float32), ([True, False, True], torch.bool), ([], torch.long),
])
def test_a_flat_list_becomes_the_tensor_torch_makes(values, dtype):
    made = host_tensor(values, dtype)
    expected = torch.tensor(values, dtype=dtype)
    assert made.dtype == expected.dtype and made.shape == expected.shape
    assert torch.equal(made, expected)


def test_what_an_array_cannot_hold_falls_back_to_torch():
    assert torch.equal(host_tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 4]]))  # nested
    assert torch.equal(host_tensor([1e300], torch.float32), torch.tensor([float("inf")]))  # past float32
    assert torch.equal(host_tensor([1, 2.5], torch.long), torch.tensor([1, 2]))  # floats into integers
    assert host_tensor((4, 5)).tolist() == [4, 5]  # not a list


def test_the_tensor_outlives_its_list_and_can_be_written():
    values = [1, 2, 3]
    made = host_tensor(values)
    del values
    made += 1
    assert made.tolist() == [2, 3, 4]
    assert to_device([7, 8], "cpu", torch.long).tolist() == [7, 8]
