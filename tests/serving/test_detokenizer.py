"""dsa_backend.detokenizer: deltas replayable by a stateless step, exact when concatenated."""

from __future__ import annotations

import random

import pytest

from dsa_backend.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, TextWindow, window_text

TEXTS = {
    "english": " The quick brown fox jumps over the lazy dog.  Twice  spaced, and\nnew lines.",
    "chinese": "深度求索的稀疏注意力模型：你好，世界！",
    "emoji": "🎉🎊 family: 👩‍👩‍👧 flags 🇯🇵🇫🇷 done",
    "mixed": "café 世界 🎉 naïve — “quotes” end",
}


def stream(tokenizer, ids, chunks, **kwargs):
    """Feed ids in the given chunk sizes; return (deltas replayed statelessly, detokenizer)."""
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    deltas, at = [], 0
    for i, n in enumerate(chunks):
        window = detok.add(ids[at:at + n], finished=i == len(chunks) - 1)
        deltas.append(window_text(tokenizer, window))
        at += n
    return deltas, detok


@pytest.mark.parametrize("name", TEXTS)
def test_token_by_token_deltas_concatenate_to_the_full_text(tokenizer, name):
    ids = tokenizer.encode(TEXTS[name])
    deltas, detok = stream(tokenizer, ids, [1] * len(ids))
    assert "".join(deltas) == tokenizer.decode(ids) == TEXTS[name] == detok.text


@pytest.mark.parametrize("name", TEXTS)
def test_no_delta_ends_in_a_split_character(tokenizer, name):
    ids = tokenizer.encode(TEXTS[name])
    deltas, _ = stream(tokenizer, ids, [1] * len(ids))
    assert not any(d.endswith(REPLACEMENT_CHAR) for d in deltas)


def test_leading_spaces_are_kept(tokenizer):
    ids = tokenizer.encode(" leading space and  two")
    deltas, _ = stream(tokenizer, ids, [1] * len(ids))
    assert deltas[0] == " leading"
    assert "".join(deltas) == " leading space and  two"


def test_emoji_split_over_three_tokens_arrives_whole_with_the_last(tokenizer):
    ids = tokenizer.encode(" 🎉")
    assert len(ids) == 3
    deltas, _ = stream(tokenizer, ids, [1, 1, 1])
    assert deltas == [" ", "", "🎉"]      # the settled space goes out at once


def test_random_token_streams_in_random_chunks_match_the_full_decode(tokenizer):
    # A random-weight model emits arbitrary ids: byte tokens that never form valid UTF-8 too.
    rng = random.Random(0)
    for _ in range(40):
        ids = [rng.randrange(tokenizer.vocab_size + 500) for _ in range(rng.randrange(1, 60))]
        chunks = []
        while sum(chunks) < len(ids):
            chunks.append(min(rng.randrange(1, 5), len(ids) - sum(chunks)))
        deltas, _ = stream(tokenizer, ids, chunks)
        assert "".join(deltas) == tokenizer.decode(ids)


def test_windows_stay_short(tokenizer):
    ids = tokenizer.encode(TEXTS["english"] * 4)
    detok = IncrementalDetokenizer(tokenizer)
    longest = max(len(detok.add([i], finished=False).token_ids) for i in ids)
    assert longest <= 4


def test_stop_string_cuts_the_text_before_it(tokenizer):
    text = "Count: one, two, STOP three four"
    ids = tokenizer.encode(text)
    deltas, detok = stream(tokenizer, ids, [1] * len(ids), stop=["STOP"])
    assert "".join(deltas) == "Count: one, two, "
    assert detok.stopped


def test_stop_string_can_be_kept(tokenizer):
    ids = tokenizer.encode("alpha beta\n\ngamma")
    deltas, _ = stream(tokenizer, ids, [1] * len(ids), stop=["\n\n"], include_stop_str_in_output=True)
    assert "".join(deltas) == "alpha beta\n\n"


def test_text_that_may_start_a_stop_string_is_held_back_then_released(tokenizer):
    ids = tokenizer.encode("a Sto b")
    deltas, detok = stream(tokenizer, ids, [1] * len(ids), stop=["Stop"])
    assert "".join(deltas) == "a Sto b"
    assert not detok.stopped
    assert deltas[1] == " "       # "Sto" might have been the start of "Stop"


def test_stop_string_spanning_tokens_matches(tokenizer):
    ids = tokenizer.encode("x 世界 y")
    deltas, detok = stream(tokenizer, ids, [1] * len(ids), stop=["界 "])
    assert "".join(deltas) == "x 世"
    assert detok.stopped


def test_after_a_stop_further_tokens_give_empty_windows(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop=["b"])
    detok.add(tokenizer.encode("a b"), finished=False)
    assert detok.add(tokenizer.encode(" c"), finished=False) == TextWindow([], 0, 0)


def test_incomplete_character_at_the_end_is_flushed_when_finished(tokenizer):
    ids = tokenizer.encode(" 🎉")[:2]
    deltas, _ = stream(tokenizer, ids, [1, 1])
    assert "".join(deltas) == tokenizer.decode(ids)
    assert deltas[-1].endswith(REPLACEMENT_CHAR)
