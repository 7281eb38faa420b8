"""A reply's cost on the CPU, old tree (pack in on_output, client_outputs unpacks) against new
(ReplyFields: pack only for the ensemble, rendered in place for a direct request)."""
import sys, time
from dsa_backend.engine import RequestOutput
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.serving import reply_layout
from dsa_backend.serving.reply_text import client_outputs
from dsa_backend.serving.request_params import LLMRequest
from dsa_backend.serving.response_stream import ResponseStream
from dsa_backend.tokenizer import Tokenizer
tok = Tokenizer(sys.argv[1])
ids = tok.encode("Hello world, this is a somewhat long text " * 200)[:500]
new = hasattr(reply_layout, "ReplyFields")
req = LLMRequest([5, 6, 7], SamplingParams(max_tokens=5000), stream=True)

def per_reply(f):
    return round(min(f() for _ in range(30)) / len(ids) * 1e6, 1)

def steps():
    s = ResponseStream("r", req, tok, arrival=0.0)
    return [s.on_output([RequestOutput("r", [t], None, None, False, None, 3, i + 1)], 0.1) for i, t in enumerate(ids)]

def timed(body):
    def run():
        t0 = time.perf_counter(); body(); return time.perf_counter() - t0
    return run

replies = steps()
wire = [reply_layout.pack(r.fields) if new else r.outputs for r in replies]
on_output = per_reply(timed(steps))
pack = per_reply(timed(lambda: [reply_layout.pack(r.fields) for r in replies])) if new else 0.0
direct = per_reply(timed(lambda: [client_outputs(tok, r.fields if new else r.outputs) for r in replies]))
post = per_reply(timed(lambda: [client_outputs(tok, reply_layout.unpack(w)) if new else client_outputs(tok, w)
                                for w in wire]))
print(f"{'new' if new else 'old'}: direct request {on_output + direct:.1f} us a reply (on_output {on_output}, "
      f"render {direct}); ensemble: dsa_llm {on_output + pack:.1f} us (pack {pack}), postprocessing {post} us")
