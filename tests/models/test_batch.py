import torch

from quill.models.batch import StepBatch


def _window_then_inputs(batch: StepBatch, keep: int) -> torch.Tensor:
    """(B, keep + max_query_len) each sequence's window (-1 - its index) then its new tokens, right-padded with 0."""
    windows = -torch.arange(1, keep + 1).repeat(batch.num_seqs, 1)
    return torch.cat([windows, batch.pad(batch.token_ids)], dim=1)


def test_last_inputs_are_each_sequences_last_real_ones():
    batch = StepBatch.build([[11, 12, 13, 14], [21], [31, 32]], [0, 0, 0])
    seq = _window_then_inputs(batch, keep=2)
    assert batch.last_inputs(seq, 2).tolist() == [[13, 14], [-2, 21], [31, 32]]
    # the same along the last dimension of a (B, channels, time) layout
    channels = seq[:, None, :].expand(-1, 3, -1)
    assert batch.last_inputs(channels, 2, dim=-1).tolist() == [[[13, 14]] * 3, [[-2, 21]] * 3, [[31, 32]] * 3]


def test_last_inputs_without_padding_and_of_decodes():
    for tokens in ([[1, 2, 3], [4, 5, 6]], [[7], [8]]):
        batch = StepBatch.build(tokens, [0, 0])
        seq = _window_then_inputs(batch, keep=3)
        assert batch.last_inputs(seq, 3).tolist() == [row[-3:] for row in seq.tolist()]


def test_whole_sequences():
    batch = StepBatch.whole(torch.tensor([[5, 6, 7], [8, 9, 10]]))
    assert batch.query_lens == [3, 3] and batch.slots.tolist() == [0, 1]
    assert batch.positions.tolist() == [0, 1, 2, 0, 1, 2] and batch.logits_indices is None


def test_pad_fills_past_each_sequence_and_unpad_undoes_it():
    batch = StepBatch.build([[1, 2, 3], [4]], [0, 0])
    x = batch.token_ids.float()
    assert batch.pad(x).tolist() == [[1, 2, 3], [4, 0, 0]]
    padded = batch.pad(x, float("-inf"))
    assert padded.tolist() == [[1, 2, 3], [4, float("-inf"), float("-inf")]]
    assert batch.unpad(padded).tolist() == [1, 2, 3, 4]


def test_sequences_of_one_length_pad_to_a_view_of_their_tokens():
    for tokens in ([[1, 2, 3], [4, 5, 6]], [[7], [8]]):
        batch = StepBatch.build(tokens, [0, 0])
        x = batch.token_ids.float()
        padded = batch.pad(x, float("-inf"))
        assert padded.tolist() == [[float(t) for t in seq] for seq in tokens]
        assert padded.data_ptr() == x.data_ptr()  # nothing to pad: no copy
        assert batch.unpad(padded).tolist() == x.tolist()


def test_each_token_knows_its_sequence():
    assert StepBatch.build([[1, 2, 3], [4], [5, 6]], [0, 7, 2]).seq_of_token.tolist() == [0, 0, 0, 1, 2, 2]
    assert StepBatch.build([[1], [2]], [4, 9]).seq_of_token.tolist() == [0, 1]


def test_slide_windows_reads_and_writes_the_parts_slots_in_the_states_dtype():
    batch = StepBatch.build([[11, 12, 13], [21]], [0, 0], slots=[2, 0])
    windows = torch.tensor([[-1, -2], [-3, -4], [-5, -6]], dtype=torch.bfloat16)  # (slots, K - 1)
    inputs = batch.slide_windows(windows, batch.slots, batch.pad(batch.token_ids.float()))
    assert inputs.dtype == torch.float32 and inputs.tolist() == [[-5, -6, 11, 12, 13], [-1, -2, 21, 0, 0]]
    assert windows.dtype == torch.bfloat16 and windows.tolist() == [[-2, 21], [-3, -4], [12, 13]]


def test_window_index_picks_each_tokens_window_from_its_history_and_the_packed_inputs():
    """Rows: two earlier inputs per sequence (h<seq><i>), then the packed new inputs (n<seq><i>)."""
    batch = StepBatch.build([[5, 6, 7], [8], [9, 10]], [4, 9, 0])
    keep = 2
    names = [f"h{b}{i}" for b in range(3) for i in range(keep)] + ["n00", "n01", "n02", "n10", "n20", "n21"]
    windows, ends = batch.window_index(keep)
    assert [[names[i] for i in row] for row in windows.tolist()] == [
        ["h00", "h01", "n00"], ["h01", "n00", "n01"], ["n00", "n01", "n02"],
        ["h10", "h11", "n10"],
        ["h20", "h21", "n20"], ["h21", "n20", "n21"],
    ]
    assert [[names[i] for i in row] for row in ends.tolist()] == [["n01", "n02"], ["h11", "n10"], ["n20", "n21"]]
