"""Fixed-size state slots: one per sequence, forks copy, prompt prefixes are snapshotted."""

from __future__ import annotations

import torch

from quill.models.state import SlotState
from quill.server.engine.cache.state_kinds import Slots
from quill.server.engine.cache.state_slots import StateSlotManager


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


def test_states_are_saved_where_chunks_prompts_and_sequences_end_and_resumed_at_any_token():
    m, state = manager(snapshots=4, interval=4)
    prompt = list(range(10))
    m.admit(1, prompt, 9)
    assert m.chunk_limit(1, 0, 10) is None  # an unseen prompt is computed in chunks as large as the step allows
    state["h"][m.slot(1)] = 6.0  # "the state after 6 tokens": a chunk ended there
    m.commit(1, prompt, 6, 10)
    state["h"][m.slot(1)] = 10.0
    m.commit(1, prompt, 10, 10)  # the prompt ended
    state["h"][m.slot(1)] = 11.0
    m.commit(1, prompt + [50], 11, 10)  # a decode step: no snapshot
    state["h"][m.slot(1)] = 12.0
    m.retire(1, prompt + [50, 51, 52], 12)  # finished; its last token was never read
    assert m.num_snapshots == 3 and m.num_free_slots == 2

    def resumes(seq_id, tokens, max_cached):
        found = m.admit(seq_id, tokens, max_cached)
        value = state["h"][m.slot(seq_id)][0].item()
        m.free(seq_id)
        return found, value

    assert resumes(2, prompt + [50, 51, 52, 53], 13) == (12, 12.0)  # the next turn of the conversation
    assert resumes(3, prompt + [60], 10) == (10, 10.0)
    assert resumes(4, prompt[:7] + [42], 7) == (6, 6.0)
    assert resumes(5, prompt, 9) == (6, 6.0)  # the whole prompt again: its last token's logits are needed
    assert resumes(6, [9] + prompt, 10) == (0, 0.0)
    assert m.prefix_hits == 12 + 10 + 6 + 6


def test_a_prefix_earlier_prompts_shared_is_computed_as_a_chunk_of_its_own_and_saved():
    m, state = manager(snapshots=4, interval=4)
    system = list(range(100, 109))  # nine tokens every prompt starts with
    m.admit(1, system + [1, 2, 3], 11)
    assert m.chunk_limit(1, 0, 12) is None
    m.commit(1, system + [1, 2, 3], 12, 12)
    m.free(1)
    m.admit(2, system + [7, 8], 10)  # its first two blocks were seen: the prefill pauses after them
    assert m.chunk_limit(2, 0, 11) == 8 and m.chunk_limit(2, 8, 11) is None
    state["h"][m.slot(2)] = 8.0  # "the state after 8 tokens"
    m.commit(2, system + [7, 8], 8, 11)
    m.free(2)
    assert m.admit(3, system + [5], 9) == 8
    assert torch.all(state["h"][m.slot(3)] == 8.0)  # resumed from the state saved where the prompts part


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
