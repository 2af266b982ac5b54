"""Fixed-size state slots: one per sequence, forks copy, prompt prefixes are snapshotted."""

from __future__ import annotations

import torch

from models.state import SlotState
from server.engine.state_kinds import Slots
from server.engine.state_slots import StateSlotManager


class Applied(StateSlotManager):
    """A manager whose device work is carried out at once, as the runner does before the next step."""

    def __init__(self, state: SlotState, *args):
        super().__init__(state.num_slots, *args)
        self.state = state

    def admit(self, *args) -> int:
        found = super().admit(*args)
        self._apply()
        return found

    def fork(self, *args) -> None:
        super().fork(*args)
        self._apply()

    def commit(self, *args) -> None:
        super().commit(*args)
        self._apply()

    def _apply(self) -> None:
        for op in self.take_ops():
            Slots.apply(self.state, op)


def manager(num_seq_slots=2, snapshots=2, interval=4, caching=True):
    state = SlotState({"h": torch.zeros(num_seq_slots + snapshots, 3)})
    return Applied(state, num_seq_slots, interval, caching), state


def test_admission_takes_a_zeroed_slot_and_free_returns_it():
    m, state = manager()
    state["h"].fill_(7.0)
    assert m.can_admit(2) and not m.can_admit(3)
    assert m.admit(1, [1, 2, 3], 2) == 0
    assert torch.all(state["h"][m.slot(1)] == 0)
    assert m.usage == 0.5
    m.free(1)
    assert m.usage == 0 and m.can_admit(2)


def test_fork_copies_the_slot():
    m, state = manager()
    m.admit(1, [1, 2], 1)
    state["h"][m.slot(1)] = torch.tensor([1.0, 2.0, 3.0])
    m.fork(1, 2)
    assert m.slot(2) != m.slot(1)
    assert torch.equal(state["h"][m.slot(2)], state["h"][m.slot(1)])
    assert not m.can_admit(1)


def test_prompt_prefix_is_snapshotted_and_reused():
    m, state = manager(interval=4)
    prompt = list(range(10))
    m.admit(1, prompt, 9)
    assert m.chunk_limit(0, 10) == 4  # chunks stop at snapshot points
    assert m.chunk_limit(4, 10) == 4
    assert m.chunk_limit(8, 10) is None  # the rest of the prompt in one go
    state["h"][m.slot(1)] = 4.0  # "the state after 4 tokens"
    m.commit(1, prompt, 4, 10)
    state["h"][m.slot(1)] = 8.0
    m.commit(1, prompt, 8, 10)
    m.free(1)
    cached = m.admit(2, prompt[:8] + [42, 43], 9)
    assert cached == 8 and torch.all(state["h"][m.slot(2)] == 8.0)
    m.free(2)
    cached = m.admit(3, prompt[:6] + [42], 6)
    assert cached == 4 and torch.all(state["h"][m.slot(3)] == 4.0)
    assert m.prefix_hits == 12


def test_snapshots_are_evicted_oldest_first():
    m, state = manager(snapshots=1, interval=2)
    for seq_id, prompt in [(1, [1, 2, 3]), (2, [4, 5, 6])]:
        m.admit(seq_id, prompt, 2)
        m.commit(seq_id, prompt, 2, 3)
        m.free(seq_id)
    assert m.admit(3, [1, 2, 9], 2) == 0  # evicted by [4, 5]
    m.free(3)
    assert m.admit(4, [4, 5, 9], 2) == 2


def test_a_prompt_started_from_a_snapshot_keys_its_later_snapshots_as_a_fresh_prompt_would():
    m, state = manager(num_seq_slots=1, snapshots=3, interval=4)
    prompt = list(range(20))
    m.admit(1, prompt[:10], 9)
    m.commit(1, prompt[:10], 4, 10)
    m.commit(1, prompt[:10], 8, 10)
    m.free(1)
    assert m.admit(2, prompt, 19) == 8  # keys continue from the snapshot it starts from
    m.commit(2, prompt, 12, 20)
    m.free(2)
    assert m.admit(3, prompt[:12] + [42], 12) == 12


def test_a_reset_forgets_the_snapshots_whose_copy_no_finished_step_made():
    m = StateSlotManager(5, 2, 4)
    prompt = list(range(14))
    m.admit(1, prompt, 13)
    m.take_ops()  # step 1 launched: prompt tokens [0, 4)
    m.step_finished()
    m.commit(1, prompt, 4, 14)  # its snapshot is copied at the start of step 2
    m.take_ops()
    m.step_finished()
    m.commit(1, prompt, 8, 14)  # copied at the start of step 3, which fails
    m.take_ops()
    m.commit(1, prompt, 12, 14)  # a failed step's commit (say its outputs could not be processed): never copied
    m.reset()
    assert len(m.snapshots) == 1 and len(m.free_snapshot_slots) == 2 and not m.ops
    assert m.admit(2, prompt, 13) == 4
