"""dsa_backend.tokenizer: the DeepSeek tokenizer loaded from a checkpoint directory."""

from __future__ import annotations

import json
import shutil

import pytest

from dsa_backend.tokenizer import Tokenizer

TEXTS = ["Hello, world!", "你好，世界。今天天气很好。", "Party 🎉🎊 time 👩‍👩‍👧", "mixed: naïve café 世界 🎉 end"]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trips(tokenizer, text):
    ids = tokenizer.encode(text)
    assert len(ids) > 1
    assert tokenizer.decode(ids) == text


def test_encodes_multilingual_text_into_several_tokens(tokenizer):
    # AutoTokenizer on these files returns a single id for this string; ours must not.
    assert len(tokenizer.encode("Hello 世界 🎉")) == 6


def test_special_token_ids_come_from_tokenizer_config(tokenizer):
    assert tokenizer.bos_token_id == 0
    assert tokenizer.eos_token_id == 1
    assert tokenizer.add_bos_token is False


def test_add_bos_token_prepends_bos(tokenizer_dir, tmp_path):
    shutil.copy(tokenizer_dir / "tokenizer.json", tmp_path)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    assert Tokenizer(tmp_path).encode("hi")[0] == 0


def test_decode_skips_special_tokens_unless_asked(tokenizer):
    ids = [tokenizer.bos_token_id, *tokenizer.encode("Hello"), tokenizer.eos_token_id]
    assert tokenizer.decode(ids) == "Hello"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>"


def test_chat_template_renders_bos_user_and_assistant_markers(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages)
    assert text == "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜>"
    ids = tokenizer.encode_chat(messages)
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "user"}], [{"role": "user", "content": 3}]])
def test_malformed_messages_are_refused_naming_the_field(tokenizer, messages):
    with pytest.raises(ValueError, match="messages"):
        tokenizer.apply_chat_template(messages)


def test_missing_tokenizer_json_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer(tmp_path)
