"""Host times of guided decoding's one-off work on the device machine: the vocabulary index (the
first guide an engine sees) and compiles of a few guides (xgrammar caches each)."""
import json, sys, time
sys.path.insert(0, "benchmarks")
from bench_engine import _GUIDE
from dsa_backend.guided import Grammars, Guide, _tokenizer_info

model = sys.argv[1]
t = time.perf_counter(); _tokenizer_info(model, 129280); index_s = time.perf_counter() - t
g = Grammars(model, 129280)
small = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
         "required": ["name", "age"]}
guides = {"small schema": Guide("json_schema", json.dumps(small)), "bench schema": Guide.from_vllm(_GUIDE),
          "any JSON": Guide("json"), "regex": Guide("regex", r"[a-z]{3,8}@[a-z]{2,6}\.(com|org)"),
          "choice of 3": Guide("choice", '["red", "green", "blue"]')}
times = {}
for name, guide in guides.items():
    t = time.perf_counter(); g.matcher(guide, {1}); first = time.perf_counter() - t
    t = time.perf_counter(); g.matcher(guide, {1}); again = time.perf_counter() - t
    times[name] = dict(first_ms=round(1e3 * first, 2), cached_ms=round(1e3 * again, 3))
print(json.dumps(dict(vocabulary_index_s=round(index_s, 2), compiles=times)))
