"""A rank's shard of a Transformer: the slices of the whole model's parameters its plan gives it, read from the
checkpoint slice by slice; and the ranks of a group stepping together (threads of this process, over gloo) give the
whole model's logits. What cannot be split is refused, saying why."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from quill.models.batch import StepBatch
from quill.models.families.transformer import TransformerConfig
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.parallel.collectives import connect
from quill.models.parallel.plan import ShardPlan, check_shardable
from quill.models.parallel.shard_loading import attach_group, load_shard
from tests.parallel_checkpoints import KINDS, write_checkpoints

CPU = torch.device("cpu")

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return write_checkpoints(tmp_path_factory.mktemp("parallel"))


def expected_part(whole: torch.Tensor, plan: ShardPlan, name: str, shape) -> torch.Tensor:
    split = plan.shard_of(name)
    if split is None:
        return whole
    dim, ranges = split
    part = torch.cat([whole.narrow(dim, r.start, len(r)) for r in ranges], dim)
    padding = list(part.shape)
    padding[dim] = shape[dim] - part.shape[dim]
    return torch.cat([part, part.new_zeros(padding)], dim)


@pytest.mark.parametrize("kind", KINDS)
def test_each_rank_reads_its_slices_of_the_whole_parameters(checkpoints, kind):
    whole = dict(load_checkpoint(checkpoints[kind], device="cpu", dtype="float32").model.named_parameters())
    for rank in range(2):
        shard, plan = load_shard(checkpoints[kind], rank, 2, CPU, torch.float32)
        params = dict(shard.named_parameters())
        for name, param in params.items():
            assert torch.equal(param, expected_part(whole[name], plan, name, param.shape)), name
        # the row-parallel layers' biases: rank 0 adds them once
        dropped = {name.split(".", 2)[2] for name in set(whole) - set(params)}
        assert dropped == ({"attn.out.bias", "mlp.down.bias"} if kind == "gpt2" and rank else set())


def test_the_vocabulary_splits_unevenly_into_padded_shards(checkpoints):
    shards = [load_shard(checkpoints["gpt2"], rank, 2, CPU, torch.float32) for rank in range(2)]
    assert [(plan.vocab, plan.vocab_shard) for _, plan in shards] == [(range(0, 151), 151), (range(151, 301), 151)]
    last = shards[1][0].embed.weight
    assert last.shape == (151, 32) and not last[-1].any() and last[-2].any()


def test_kv_heads_split_where_there_are_enough_and_replicate_where_not():
    config = TransformerConfig(vocab_size=10, d_model=32, n_heads=4, n_kv_heads=2)
    assert [ShardPlan(config, rank, 2).kv_heads for rank in range(2)] == [range(0, 1), range(1, 2)]
    assert [ShardPlan(config, rank, 4).kv_heads for rank in range(4)] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    single = TransformerConfig(vocab_size=10, d_model=32, n_heads=4, n_kv_heads=1)
    assert [ShardPlan(single, rank, 2).kv_heads for rank in range(2)] == [range(0, 1)] * 2
    assert ShardPlan(single, 1, 2).local_config().n_kv_heads == 1


@pytest.mark.parametrize("config, size, reason", [
    (dict(n_heads=4, n_kv_heads=2), 3, "its 4 attention heads do not split evenly"),
    (dict(n_heads=6, n_kv_heads=2, d_ff=66), 3, "its 2 K,V heads neither split evenly nor replicate evenly"),
    (dict(n_heads=4, d_ff=90), 4, "its feed-forward width 90 does not split evenly"),
])
def test_a_model_that_does_not_split_is_refused_saying_why(config, size, reason):
    with pytest.raises(ValueError, match=f"cannot be split over tensor-parallel size {size}: .*{reason}"):
        check_shardable(TransformerConfig(vocab_size=10, d_model=48, **config), size)


def step_together(directory, size: int, batches: list[StepBatch]) -> list[torch.Tensor]:
    """Rank 0's logits of `batches`, run in turn by `size` ranks on threads of this process, over gloo."""
    master = dist.TCPStore("127.0.0.1", 0, size, True, wait_for_workers=False)
    shards = [load_shard(directory, rank, size, CPU, torch.float32) for rank in range(size)]
    outputs, errors = [], []

    def run(rank: int) -> None:
        try:
            store = master if rank == 0 else dist.TCPStore("127.0.0.1", master.port, size, False)
            shard, plan = shards[rank]
            attach_group(shard, plan, connect(dist.PrefixStore("group", store), rank, size, CPU))
            state = shard.new_state(8, block_size=4)
            for batch in batches:
                logits = shard.step(batch, state)
                if rank == 0:
                    outputs.append(logits)
        except Exception as e:  # noqa: BLE001 - raised again below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return outputs


@pytest.mark.parametrize("kind, size", [("llama", 2), ("llama", 4), ("llama-kv1", 2), ("gpt2", 2)])
def test_ranks_stepping_together_give_the_whole_models_logits(checkpoints, kind, size):
    batches = [
        StepBatch.build([[10, 20, 30, 40, 50], [7, 8, 9], [299, 1]], [0, 0, 0], block_tables=[[0, 1], [2], [3]],
                        logits="all"),
        StepBatch.build([[11], [12, 13], [14]], [5, 3, 2], block_tables=[[0, 1], [2], [3]]),
    ]
    whole = load_checkpoint(checkpoints[kind], device="cpu", dtype="float32").model
    state = whole.new_state(8, block_size=4)
    expected = [whole.step(batch, state) for batch in batches]
    for got, want in zip(step_together(checkpoints[kind], size, batches), expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
