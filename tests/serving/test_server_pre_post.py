"""preprocessing and postprocessing on a real tritonserver, and the launcher's start/stop."""

from __future__ import annotations

import json
import os
import socket
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dsa_backend.detokenizer import IncrementalDetokenizer
from dsa_backend.serving import reply_layout
from dsa_backend.serving.fill_template import fill
from dsa_backend.serving.server import TritonServer


@pytest.fixture(scope="module")
def server(request, tokenizer_dir, tmp_path_factory):
    repo = fill(tokenizer_dir, tmp_path_factory.mktemp("prepost") / "model_repository",
                models=("preprocessing", "postprocessing"), values={"postprocessing_instance_count": "2"})
    server = TritonServer(repo, exit_timeout_s=5)
    request.addfinalizer(server.stop)
    return server.start(ready_timeout_s=120)


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def tensor(name, dtype, array):
    t = grpcclient.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return t


def strings(name, values, batch=1):
    return tensor(name, "BYTES", np.array([values] * batch, dtype=object))


def preprocess(client, text: bytes, **extra):
    inputs = [strings("text_input", [text])] + [strings(k, v) for k, v in extra.items()]
    return client.infer("preprocessing", inputs)


def test_preprocessing_encodes_text_like_the_tokenizer(client, tokenizer):
    text = "Hello 世界 🎉"
    ids = preprocess(client, text.encode()).as_numpy("input_ids")
    assert ids.tolist() == [tokenizer.encode(text)]


def test_preprocessing_renders_chat_messages(client, tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    ids = preprocess(client, b"", messages=[json.dumps(messages).encode()]).as_numpy("input_ids")
    assert ids.tolist() == [tokenizer.encode_chat(messages)]


def test_preprocessing_turns_bad_words_into_ids_and_offsets(client, tokenizer):
    out = preprocess(client, b"x", bad_words=[b"foo", b" bar baz"]).as_numpy("bad_words_ids")[0]
    foo, bar = tokenizer.encode("foo"), tokenizer.encode(" bar baz")
    assert out[0].tolist() == foo + bar
    assert out[1].tolist()[:2] == [len(foo), len(foo) + len(bar)]


@pytest.mark.parametrize("text, inputs, field", [
    (b"", {}, "text_input"),
    (b"ok \xff", {}, "text_input"),
    (b"", {"messages": [b"not json"]}, "messages"),
    (b"", {"messages": [b'[{"role": "user"}]'], }, "messages"),
])
def test_preprocessing_errors_name_the_field(client, text, inputs, field):
    with pytest.raises(InferenceServerException, match=field):
        preprocess(client, text, **inputs)


def test_batch_of_two_is_refused(client):
    with pytest.raises(InferenceServerException, match="batch size 1"):
        client.infer("preprocessing", [strings("text_input", [b"a"], batch=2)])


def test_postprocessing_replays_detokenizer_windows_exactly(client, tokenizer):
    text = "Mixed: café 世界 🎉🎊 and  spaces"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = []
    for i, token in enumerate(ids):
        w = detok.add([token], finished=i == len(ids) - 1)
        reply = reply_layout.pack(reply_layout.ReplyFields(w, counts=dict.fromkeys(reply_layout.COUNTS, 1),
                                                           floats=dict.fromkeys(reply_layout.FLOATS, 0.0),
                                                           finish_reason="", request_id="r"))
        dtypes = {"token_window": "INT32", "reply_ints": "INT32", "reply_floats": "FP32", "reply_strings": "BYTES"}
        out = client.infer("postprocessing", [tensor(name, dtypes[name], array[np.newaxis])
                                              for name, array in reply.items()])
        deltas.append(out.as_numpy("text_output")[0][0].decode())
    assert "".join(deltas) == text
    assert deltas[:2] == ["Mixed", ":"]


def test_starting_a_running_server_again_is_refused(server):
    # a second start used to launch a second server on other ports and leave the first running
    with pytest.raises(RuntimeError, match="already running"):
        server.start(ready_timeout_s=5)


def test_stop_kills_the_whole_process_group(tokenizer_dir, tmp_path):
    repo = fill(tokenizer_dir, tmp_path / "model_repository", models=("postprocessing",))
    server = TritonServer(repo, exit_timeout_s=2).start(ready_timeout_s=120)
    pgid = server.process.pid
    assert server.stop(timeout_s=20) is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)      # signal 0: does any process of the group exist?


def test_a_chosen_port_taken_before_the_server_binds_it_is_chosen_again(tokenizer_dir, tmp_path):
    # as when another server starting at the same moment takes it (two test workers did)
    repo = fill(tokenizer_dir, tmp_path / "model_repository", models=("postprocessing",))
    server = TritonServer(repo, exit_timeout_s=2)
    taken = server.ports.metrics
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            server.start(ready_timeout_s=120)
            assert server.ports.metrics != taken
            assert urllib.request.urlopen(server.metrics_url, timeout=10).status == 200
        finally:
            server.stop(timeout_s=20)
    assert b"already in use" in server.log_file.read_bytes()


def test_start_fails_fast_with_the_server_log_when_models_do_not_load(tmp_path):
    repo = tmp_path / "model_repository"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\nkind: ${oops}\n')
    with pytest.raises(RuntimeError, match="broken"):
        TritonServer(repo, exit_timeout_s=2).start(ready_timeout_s=120)
