from hypothesis import given, settings
from hypothesis import strategies as st

from quill.server.sampling.params import SamplingParams
from quill.server.sampling.stop import StopChecker

EOS = 0
WORD = 5  # an ordinary token


def feed(checker: StopChecker, pieces: list[str], token_ids: list[int] | None = None):
    """Feeds token texts one by one; returns (decision, text) at the first stop or after the last piece."""
    text = ""
    token_ids = token_ids or [WORD] * len(pieces)
    for count, (token_id, piece) in enumerate(zip(token_ids, pieces), start=1):
        text += piece
        decision = checker.check(token_id, text, count)
        if decision.finished:
            return decision, text
    return decision, text


def final_text(decision, text: str) -> str:
    return text[: len(text) - decision.trim]


def test_stop_string_spanning_tokens_is_cut_from_the_text():
    checker = StopChecker(SamplingParams(stop=["lo Wor"], max_tokens=10), [EOS])
    decision, text = feed(checker, ["Hel", "lo W", "orld", "!"])
    assert decision == (True, "stop", len("lo World"))
    assert final_text(decision, text) == "Hel"
    assert checker.stop_reason == "lo Wor"


def test_earliest_stop_string_wins_when_two_complete_together():
    checker = StopChecker(SamplingParams(stop=["cd", "bc"], max_tokens=10), [EOS])
    decision, text = feed(checker, ["a", "bcd"])
    assert final_text(decision, text) == "a"
    assert checker.stop_reason == "bc"


def test_stop_string_inside_one_token():
    checker = StopChecker(SamplingParams(stop=["\n\n"], max_tokens=10), [EOS])
    decision, text = feed(checker, ["one", " two\n\nthree"])
    assert decision.finish_reason == "stop"
    assert final_text(decision, text) == "one two"


def test_eos_stops_and_its_text_is_dropped():
    checker = StopChecker(SamplingParams(max_tokens=10), [EOS])
    decision, text = feed(checker, ["a", "b", "</s>"], [WORD, WORD, EOS])
    assert decision == (True, "stop", 4)
    assert final_text(decision, text) == "ab"
    assert checker.stop_reason is None


def test_eos_with_empty_text_trims_nothing():
    decision, _ = feed(StopChecker(SamplingParams(), [EOS]), ["a", ""], [WORD, EOS])
    assert decision == (True, "stop", 0)


def test_ignore_eos_runs_to_the_length_limit():
    checker = StopChecker(SamplingParams(max_tokens=3, ignore_eos=True), [EOS])
    decision, _ = feed(checker, ["a", "", "b"], [WORD, EOS, WORD])
    assert decision == (True, "length", 0)


def test_stop_token_ids_stop_like_eos():
    checker = StopChecker(SamplingParams(stop_token_ids=[9], max_tokens=10, ignore_eos=True), [EOS])
    decision, text = feed(checker, ["a", "\n"], [WORD, 9])
    assert decision == (True, "stop", 1)
    assert final_text(decision, text) == "a"
    assert checker.stop_reason == 9


def test_max_tokens_gives_length():
    checker = StopChecker(SamplingParams(max_tokens=2), [EOS])
    assert feed(checker, ["a", "b"])[0] == (True, "length", 0)


def test_stop_string_on_the_last_allowed_token_is_a_stop():
    checker = StopChecker(SamplingParams(max_tokens=2, stop=["b"]), [EOS])
    decision, text = feed(checker, ["a", "b"])
    assert decision.finish_reason == "stop"
    assert final_text(decision, text) == "a"


def test_min_tokens_blocks_eos_until_that_many_tokens_came_before_it():
    params = SamplingParams(min_tokens=2, max_tokens=10, stop_token_ids=[9])
    for stop_id in (EOS, 9):
        checker = StopChecker(params, [EOS])
        assert not checker.check(stop_id, "", 1).finished
        assert not checker.check(stop_id, "", 2).finished
        assert checker.check(stop_id, "", 3).finished


def test_min_tokens_blocks_stop_strings_too():
    checker = StopChecker(SamplingParams(min_tokens=2, max_tokens=10, stop=["x"]), [EOS])
    assert not checker.check(WORD, "x", 1).finished
    assert not checker.check(WORD, "xa", 2).finished
    decision = checker.check(WORD, "xax", 3)  # only a stop completed after min_tokens counts
    assert decision.finished and final_text(decision, "xax") == "xa"


def test_hold_back_keeps_the_longest_possible_start_of_a_stop_string():
    checker = StopChecker(SamplingParams(stop=["</end>", "###"]), [EOS])
    assert checker.hold_back("text </en") == 4
    assert checker.hold_back("text ##") == 2
    assert checker.hold_back("text <") == 1
    assert checker.hold_back("text") == 0
    assert checker.hold_back("") == 0
    assert StopChecker(SamplingParams(), [EOS]).hold_back("anything<") == 0


ALPHABET = "ab\n"


@settings(max_examples=200, deadline=None)
@given(
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
    pieces=st.lists(st.text(ALPHABET, max_size=3), max_size=12),
)
def test_streaming_never_shows_a_stop_string_or_its_start(stops, pieces):
    checker = StopChecker(SamplingParams(stop=stops, max_tokens=len(pieces) + 1), [EOS])
    text, sent = "", 0
    for count, piece in enumerate(pieces, start=1):
        before = text
        text += piece
        decision = checker.check(WORD, text, count)
        if decision.finished:
            final = final_text(decision, text)
            assert sent <= len(final), "streamed characters were cut afterwards"
            assert not any(s in final for s in stops)
            assert any(text.startswith(s, len(final)) for s in stops), "cut exactly where a stop string starts"
            assert not any(s in before for s in stops), "stopped at the first token completing a stop string"
            return
        visible = len(text) - checker.hold_back(text)
        assert visible >= sent, "a streamed client never takes text back"
        sent = visible
    assert not any(s in text for s in stops)
