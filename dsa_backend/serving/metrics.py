"""dsa_llm's Prometheus metrics through pb_utils.MetricFamily (served on Triton's metrics port)."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from dsa_backend.serving.response_stream import Reply

# Seconds; TTFT spans CPU prefill of long prompts, ITL a single decode step.
TTFT_BUCKETS = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0]
ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
# The MLA latent pool and the indexer-key pool hand out the same page ids, so both report the
# engine's one page count; the label keeps dashboards honest if they ever diverge.
POOLS = ("mla", "indexer")
# Tokens one request gets from one verify step: its accepted drafts plus the target's own token,
# so 1 ..= speculative_num_steps + 1 (at most 17).
ACCEPT_LENGTH_BUCKETS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 17]


class ServerMetrics:
    """The counters and histograms count every replica's requests together; the gauges of the
    engine (requests running and waiting, pages) are each replica's, labelled replica="r"."""

    def __init__(self, model: str, version: str, replicas: int = 1):
        labels = {"model": model, "version": version}
        by_replica = [{**labels, "replica": str(r)} for r in range(replicas)]

        def family(name, description, kind):
            return pb_utils.MetricFamily(name=name, description=description, kind=kind)

        counter, gauge, histogram = (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE,
                                     pb_utils.MetricFamily.HISTOGRAM)
        # Families must outlive their metrics, so both are kept on self.
        self._families = [
            family("dsa_requests_total", "Finished requests (each of n samples counts) by finish reason", counter),
            family("dsa_prompt_tokens_total", "Prompt tokens of admitted requests", counter),
            family("dsa_generation_tokens_total", "Generated tokens", counter),
            family("dsa_time_to_first_token_seconds", "Arrival to first generated token", histogram),
            family("dsa_inter_token_latency_seconds", "Time between generated tokens", histogram),
            family("dsa_requests_running", "Requests in the running batch", gauge),
            family("dsa_requests_waiting", "Requests queued or retracted", gauge),
            family("dsa_kv_pages_used", "KV cache pages in use", gauge),
            family("dsa_kv_pages_free", "KV cache pages free (cached pages no request holds included)", gauge),
            family("dsa_kv_pages_cached", "KV cache pages in the prefix cache", gauge),
            family("dsa_prefix_cache_hit_tokens_total",
                   "Prompt tokens found in the prefix cache at admission (not computed)", counter),
            family("dsa_retractions_total", "Requests preempted for KV pages (recomputed later)", counter),
            family("dsa_spec_draft_tokens_total", "Speculative draft tokens verified by the target", counter),
            family("dsa_spec_accepted_tokens_total", "Speculative draft tokens accepted", counter),
            family("dsa_spec_accept_length", "Tokens per request per verify step (accepted drafts + 1)",
                   histogram),
            family("dsa_kernel_loads_total",
                   "GPU kernels Triton compiled or read from its cache while serving (a step waited on each)",
                   counter),
            family("dsa_kernel_load_seconds_total", "Seconds steps waited on those kernel loads", counter),
        ]
        (requests, prompt, generation, ttft, itl, running, waiting, used, free, cached, cache_hits, retractions,
         drafted, accepted, accept_length, kernel_loads, kernel_load_seconds) = self._families
        self._labels = labels
        self._requests_family = requests
        self._requests: dict[str, object] = {}
        self.prompt_tokens = prompt.Metric(labels=labels)
        self.generation_tokens = generation.Metric(labels=labels)
        self.ttft = ttft.Metric(labels=labels, buckets=TTFT_BUCKETS)
        self.itl = itl.Metric(labels=labels, buckets=ITL_BUCKETS)
        self.running = [running.Metric(labels=r) for r in by_replica]
        self.waiting = [waiting.Metric(labels=r) for r in by_replica]
        self.pages_used = [{p: used.Metric(labels={**r, "pool": p}) for p in POOLS} for r in by_replica]
        self.pages_free = [{p: free.Metric(labels={**r, "pool": p}) for p in POOLS} for r in by_replica]
        self.pages_cached = [{p: cached.Metric(labels={**r, "pool": p}) for p in POOLS} for r in by_replica]
        # counters of engine totals since start (stats' keys), with the total each replica's
        # engine last reported
        self._engine_counters = {"retractions": retractions.Metric(labels=labels),
                                 "prefix_cache_hit_tokens": cache_hits.Metric(labels=labels),
                                 "kernel_loads": kernel_loads.Metric(labels=labels),
                                 "kernel_load_seconds": kernel_load_seconds.Metric(labels=labels)}
        self._engine_totals_seen = [dict.fromkeys(self._engine_counters, 0) for _ in by_replica]
        self.spec_draft_tokens = drafted.Metric(labels=labels)
        self.spec_accepted_tokens = accepted.Metric(labels=labels)
        self.spec_accept_length = accept_length.Metric(labels=labels, buckets=ACCEPT_LENGTH_BUCKETS)
        self._counters = {"generation": self.generation_tokens, "drafted": self.spec_draft_tokens,
                          "accepted": self.spec_accepted_tokens}
        self._pending_counts = dict.fromkeys(self._counters, 0)

    def request_admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.increment(prompt_tokens)

    def reply_sent(self, reply: Reply, finish_reason: str) -> None:
        # Every update is a message to the server process, so the counters add up here and go
        # out with the gauges (engine_stats: every 0.1 s, and before a request's last response).
        self._pending_counts["generation"] += reply.new_tokens
        self._pending_counts["drafted"] += reply.new_draft_tokens
        self._pending_counts["accepted"] += reply.new_accepted_draft_tokens
        if reply.ttft_s is not None:
            self.ttft.observe(reply.ttft_s)
        if reply.itl_s is not None:
            self.itl.observe(reply.itl_s)
        for length in reply.accept_lengths:
            self.spec_accept_length.observe(length)
        if reply.final:
            self.request_finished(finish_reason)

    def request_finished(self, finish_reason: str) -> None:
        reason = finish_reason or "unknown"
        if reason not in self._requests:
            self._requests[reason] = self._requests_family.Metric(
                labels={**self._labels, "finish_reason": reason})
        self._requests[reason].increment(1)

    def engine_stats(self, replica_stats: list[dict]) -> None:
        """Refresh from each replica's engine stats (Replicas.stats())."""
        for key, count in self._pending_counts.items():
            if count:
                self._counters[key].increment(count)
                self._pending_counts[key] = 0
        # Pages first, so that a scrape between two sets sees a finished request's pages freed no
        # later than the request gone. The gauges are separate updates all the same: a scrape on
        # the CI machine once read running == 0 beside the page count of the refresh before.
        for r, stats in enumerate(replica_stats):
            for pool in POOLS:
                self.pages_used[r][pool].set(stats["kv_pages_total"] - stats["kv_pages_free"])
                self.pages_free[r][pool].set(stats["kv_pages_free"])
                self.pages_cached[r][pool].set(stats["kv_pages_cached"])
            self.running[r].set(stats["running"])
            self.waiting[r].set(stats["waiting"])
            seen = self._engine_totals_seen[r]
            for key, counter in self._engine_counters.items():
                if stats[key] < seen[key]:   # a restarted engine counts from 0
                    seen[key] = 0
                if stats[key] > seen[key]:
                    counter.increment(stats[key] - seen[key])
                    seen[key] = stats[key]
