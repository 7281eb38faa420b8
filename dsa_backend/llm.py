"""Offline API: LLM(model_dir, **engine_args).generate(prompts, sampling_params)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsa_backend.detokenizer import IncrementalDetokenizer
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.tokenizer import Tokenizer


@dataclass(frozen=True)
class CompletionOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    cumulative_logprob: float | None
    logprobs: list[float] | None
    num_cached_tokens: int = 0        # prompt tokens found in the prefix cache, not computed
    error: str | None = None          # why, when finish_reason is "error" (a guide that did not compile)
    index: int = 0                    # which of its prompt's n samples (SamplingParams.n)
    # SamplingParams.prompt_logprobs: one a prompt token, None for the first; on sample 0 only
    prompt_logprobs: list[float | None] | None = None
    # SamplingParams.top_logprobs: for each token, the most likely tokens' (token id, logprob)
    top_logprobs: list[tuple[tuple[int, float], ...]] | None = None


class LLM:
    """Runs an Engine in the caller's thread until every prompt is done. With tensor_parallel_size
    > 1 the other ranks run in processes of their own until close() (or the end of a `with`
    block, or of the interpreter)."""

    def __init__(self, model: str | Path, **engine_args):
        self.engine = Engine(EngineArgs(model=str(model), **engine_args))
        self.tokenizer = Tokenizer(model)
        self._next_id = 0

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 priority: list[int] | None = None) -> list[CompletionOutput]:
        """prompts: a string, a list of token ids, or a list of either. One output per prompt, in
        order; n of them for a prompt sampled n times (SamplingParams.n), by index. priority: one
        a prompt, a lower number served first (0 each by default)."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling_params for {len(prompts)} prompts")
        priority = priority or [0] * len(prompts)
        if len(priority) != len(prompts):
            raise ValueError(f"got {len(priority)} priorities for {len(prompts)} prompts")
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        # (request id, prompt, the sample's params, its index), prompt by prompt
        requests = []
        for prompt, p, rank in zip(ids, params, priority):
            for index, sample in enumerate(p.samples()):
                requests.append((f"llm-{self._next_id}", prompt, sample, index, rank))
                self._next_id += 1
        outputs: dict[str, list] = {r[0]: [] for r in requests}
        detok = {rid: IncrementalDetokenizer(self.tokenizer, p.stop, p.include_stop_str_in_output,
                                             p.skip_special_tokens) for rid, _, p, _, _ in requests}
        for rid, prompt, p, _, rank in requests:
            self.engine.add_request(rid, prompt, p, rank)
        finished: dict[str, str] = {}
        while len(finished) < len(requests):
            for out in self.engine.step():
                outputs[out.request_id].append(out)
                detok[out.request_id].add(out.new_token_ids, out.finished)
                if out.finished:
                    finished[out.request_id] = out.finish_reason
                elif detok[out.request_id].stopped:  # a stop string matched
                    self.engine.abort(out.request_id)
                    finished[out.request_id] = "stop"
        results = []
        for rid, prompt, p, index, _ in requests:
            steps = outputs[rid]
            logprobs = [lp for o in steps for lp in (o.new_logprobs or [])] if p.logprobs else None
            top = [t for o in steps for t in (o.new_top_logprobs or [])] if p.top_logprobs else None
            results.append(CompletionOutput(
                prompt_token_ids=prompt, token_ids=[t for o in steps for t in o.new_token_ids],
                text=detok[rid].text, finish_reason=finished[rid],
                cumulative_logprob=steps[-1].cumulative_logprob, logprobs=logprobs,
                num_cached_tokens=steps[-1].num_cached_tokens, error=steps[-1].error, index=index,
                prompt_logprobs=next((o.prompt_logprobs for o in steps if o.prompt_logprobs is not None), None),
                top_logprobs=top))
        return results
