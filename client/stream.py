"""Stream one completion from the `dsa` ensemble to the terminal.

    python -m dsa_client.stream --url 127.0.0.1:8001 --max-tokens 64 "Tell me about sparse attention"
    python -m dsa_client.stream -n 3 --temperature 0.8 "Name a colour"    # three samples, printed at the end
    python -m dsa_client.stream --score --max-tokens 1 "Some text"         # its log prob and perplexity too
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from dsa_client.grpc_stream import MODEL, generate_samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt", help="prompt text; with --chat, the user message")
    parser.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address")
    parser.add_argument("--model", default=MODEL,
                        help="the Triton model to send to: the dsa ensemble, or dsa_llm (text straight to it)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("-n", type=int, default=1, help="samples of the prompt (num_return_sequences)")
    parser.add_argument("--priority", type=int, help="a lower number is served first (default 0)")
    parser.add_argument("--stop", action="append", help="stop string (repeatable)")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    parser.add_argument("--no-stream", action="store_true", help="one response at the end")
    parser.add_argument("--score", action="store_true",
                        help="also print the prompt's log prob and perplexity (return_prompt_log_probs)")
    parser.add_argument("--guide-type", choices=["json", "json_schema", "regex", "ebnf_grammar", "choice"],
                        help="structured output: the guide's kind")
    parser.add_argument("--guide", help="the JSON schema, regex, EBNF grammar or JSON list of choices; "
                                        "@FILE reads it from FILE")
    args = parser.parse_args(argv)
    guide = args.guide
    if guide and guide.startswith("@"):
        with open(guide[1:], encoding="utf-8") as f:
            guide = f.read()
    messages = json.dumps([{"role": "user", "content": args.prompt}]) if args.chat else None
    samples = generate_samples(
        args.url, "" if args.chat else args.prompt, args.max_tokens, stream=not args.no_stream,
        on_delta=(lambda d: print(d, end="", flush=True)) if args.n == 1 else None, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop_words=args.stop, messages=messages,
        exclude_input_in_output=True, guided_decoding_guide_type=args.guide_type, guided_decoding_guide=guide,
        num_return_sequences=args.n if args.n != 1 else None, return_prompt_log_probs=args.score or None,
        priority=args.priority, model=args.model)
    failed = False
    for index, completion in enumerate(samples):
        if args.n != 1:
            print(f"--- sample {index} ---\n{completion.text}", end="")
        print()
        if completion.error:
            print(f"error: {completion.error}", file=sys.stderr)
            failed = True
        else:
            print(format_timing(completion), file=sys.stderr)
            if args.score and index == 0:
                print(format_score(completion.prompt_log_probs), file=sys.stderr)
    return 1 if failed else 0


def format_score(prompt_log_probs: list[float]) -> str:
    """The prompt's log prob (after its first token, which nothing predicts) and perplexity."""
    total = sum(prompt_log_probs)
    perplexity = math.exp(-total / len(prompt_log_probs)) if prompt_log_probs else float("nan")
    return f"[prompt log prob {total:.4f} over {len(prompt_log_probs)} tokens, perplexity {perplexity:.3f}]"


def format_timing(completion) -> str:
    n = completion.num_output_tokens
    e2e = completion.e2e_s or 0.0
    ttft = completion.ttft_s
    decode = (n - 1) / (e2e - ttft) if ttft is not None and n > 1 and e2e > ttft else float("nan")
    return (f"[{completion.num_input_tokens} prompt tokens, {n} generated, finish_reason="
            f"{completion.finish_reason}; TTFT {ttft if ttft is not None else float('nan'):.3f} s, "
            f"total {e2e:.3f} s, {decode:.1f} tokens/s after the first{_acceptance(completion)}]")


def _acceptance(completion) -> str:
    if not completion.draft_tokens:
        return ""
    rate = completion.accepted_draft_tokens / completion.draft_tokens
    return f"; drafts accepted {completion.accepted_draft_tokens}/{completion.draft_tokens} ({rate:.2f})"


if __name__ == "__main__":
    sys.exit(main())
