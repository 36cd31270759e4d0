"""GET /metrics (Prometheus text format) and the middleware that measures every request.

Each app has its own CollectorRegistry, never the process-global one. Request counts and
latencies are recorded as requests end; everything else (lifecycle counters, leases, queue
depth, tokens, prompt-cache figures) is read at scrape time from the registry and from the
workers' GET /stats, so it cannot drift from what the daemon actually holds.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from mlxd.shared.logs import bind_log_context, reset_log_context
from mlxd.shared.routes import PUBLIC_PATHS
from mlxd.supervisor.admin.views import fan_out, worker_rss_bytes
from mlxd.supervisor.http.audio import AUDIO_SECONDS
from mlxd.supervisor.http.proxy import ON_FIRST_TOKEN
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.registry.registry import Registry

METRICS = "metrics"
STATS_TIMEOUT_S = 2.0
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CACHE_TIERS = ("ram", "ssd")
CACHE_EVENTS = (  # (event label, key in the worker's /stats)
    ("ssd_restore", "cache_ssd_restores"),
    ("spill", "cache_spills"),
    ("demotion", "cache_demotions"),
    ("ssd_write", "cache_ssd_writes"),
    ("write_dropped", "cache_write_drops"),
    ("ssd_corrupt", "cache_ssd_corrupt"),
    ("ram_eviction", "cache_ram_evictions"),
    ("ssd_eviction", "cache_ssd_evictions"),
    ("ssd_error", "cache_ssd_errors"),
    ("ssd_rejected", "cache_ssd_rejected"),
    ("write_failed", "cache_write_failed"),
    ("reply_splice", "cache_reply_splices"),
)
# Why entries were written to the SSD tier: a session's, reused, or only by a drain or flush.
SSD_WRITE_REASONS = ("session", "reused", "drain")


class Metrics:
    """The app's Prometheus registry and its request instruments."""

    def __init__(self, reg: Registry):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "mlxd_requests",
            "HTTP requests by model, route and status",
            ["model", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "mlxd_request_duration_seconds",
            "Time from request to the end of its response",
            ["model", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "mlxd_time_to_first_token_seconds",
            "Time until the first chunk of a streamed response was written",
            ["model", "route"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.audio = Counter(
            "mlxd_audio_seconds",
            "Seconds of audio transcribed or translated, by model and route",
            ["model", "route"],
            registry=self.registry,
        )
        self.snapshot = ScrapeCollector(reg)
        self.registry.register(self.snapshot)

    async def render(self) -> bytes:
        self.snapshot.workers = {
            m: r.body
            for m, r in (await fan_out(self.snapshot.reg, "GET", "/stats", STATS_TIMEOUT_S)).items()
            if r.status == 200
        }
        return generate_latest(self.registry)


class ScrapeCollector:
    """Builds the scrape-time families from the registry and the last gathered worker stats."""

    def __init__(self, reg: Registry):
        self.reg = reg
        self.workers: dict[str, dict] = {}

    def collect(self):
        reg, c = self.reg, self.reg.lifecycle.counters
        for name, doc, value in (
            ("loads", "Workers that started and became ready", c.loads),
            ("load_failures", "Loads refused because the model does not fit", c.load_failures),
            ("evictions", "Idle models unloaded to make room for another", c.evictions),
            ("unloads", "Workers drained and stopped", c.unloads),
            ("crashes", "Workers that died unexpectedly", c.crashes),
            ("reloads", "Operator reloads (hot swaps and cold reloads)", c.reloads),
        ):
            yield CounterMetricFamily(f"mlxd_{name}", doc, value=value)
        slots = list(reg.lifecycle.slots.values())
        yield GaugeMetricFamily(
            "mlxd_models_loaded",
            "Models with a READY worker",
            value=sum(s.state is State.READY for s in slots),
        )
        yield GaugeMetricFamily(
            "mlxd_queue_depth",
            "Requests waiting for a model to be ready",
            value=sum(s.waiting for s in slots),
        )
        in_flight = sum(s.leases for s in [*slots, *reg.lifecycle.retired])
        yield GaugeMetricFamily("mlxd_leases", "Requests in flight", value=in_flight)
        state = GaugeMetricFamily(
            "mlxd_model_state", "1 for the model's lifecycle state", labels=["model", "state"]
        )
        leases = GaugeMetricFamily(
            "mlxd_model_leases", "Requests in flight per model", labels=["model"]
        )
        queued = GaugeMetricFamily(
            "mlxd_model_queued", "Requests waiting per model", labels=["model"]
        )
        rss = GaugeMetricFamily(
            "mlxd_worker_rss_bytes", "Resident memory of the worker", labels=["model"]
        )
        for s in slots:
            state.add_metric([s.id, s.state.value], 1)
            leases.add_metric([s.id], s.leases)
            queued.add_metric([s.id], s.waiting)
            if (mem := worker_rss_bytes(s)) is not None:
                rss.add_metric([s.id], mem)
        yield from (state, leases, queued, rss)
        yield from self._worker_families()

    def _worker_families(self):
        prompt = CounterMetricFamily(
            "mlxd_prompt_tokens",
            "Prompt tokens processed by workers (per worker lifetime)",
            labels=["model"],
        )
        gen = CounterMetricFamily(
            "mlxd_generation_tokens",
            "Tokens generated by workers (per worker lifetime)",
            labels=["model"],
        )
        hits = CounterMetricFamily(
            "mlxd_prompt_cache_hits", "Prompt-cache hits", labels=["model", "tier"]
        )
        misses = CounterMetricFamily(
            "mlxd_prompt_cache_misses", "Prompt-cache misses", labels=["model", "tier"]
        )
        size = GaugeMetricFamily(
            "mlxd_prompt_cache_bytes", "Bytes held by the prompt cache", labels=["model", "tier"]
        )
        hit_tokens = CounterMetricFamily(
            "mlxd_prompt_cache_hit_tokens", "Prompt tokens served from the cache", labels=["model"]
        )
        entries = GaugeMetricFamily(
            "mlxd_prompt_cache_entries", "Prompt-cache entries", labels=["model", "tier"]
        )
        events = CounterMetricFamily(
            "mlxd_prompt_cache_events",
            "Prompt-cache events: SSD restores, RAM-to-SSD spills,"
            " demotions, writes, dropped writes, corrupt files, evictions",
            labels=["model", "event"],
        )
        ssd_bytes = CounterMetricFamily(
            "mlxd_prompt_cache_ssd_written_bytes",
            "Bytes written to the SSD prompt-cache tier (data files and sidecars)",
            labels=["model"],
        )
        ssd_writes = CounterMetricFamily(
            "mlxd_prompt_cache_ssd_written_entries",
            "Entries written to the SSD prompt-cache tier by reason: session, reused, drain",
            labels=["model", "reason"],
        )
        drafted = CounterMetricFamily(
            "mlxd_spec_drafted_tokens", "Tokens drafted by speculative decoding", labels=["model"]
        )
        accepted = CounterMetricFamily(
            "mlxd_spec_accepted_tokens",
            "Drafted tokens the target accepted (speculative decoding)",
            labels=["model"],
        )
        queue = SummaryMetricFamily(
            "mlxd_engine_queue_wait_seconds",
            "Time a request waited in its worker for room in the batch (to its first token)",
            labels=["model"],
        )
        admitted = SummaryMetricFamily(
            "mlxd_engine_admitted_to_first_token_seconds",
            "Time from joining the batch to the first token (prefill and shared steps)",
            labels=["model"],
        )
        preempted = CounterMetricFamily(
            "mlxd_engine_preemptions",
            "Rows taken out of the batch for want of KV budget, resumed later with the same output",
            labels=["model"],
        )
        for model, st in sorted(self.workers.items()):
            preempted.add_metric([model], _num(st, "preemptions"))
            first = _num(st, "first_tokens")
            queue.add_metric([model], first, _num(st, "queue_wait_s"))
            admitted.add_metric([model], first, _num(st, "admitted_to_first_token_s"))
            drafted.add_metric([model], _num(st, "spec_drafted_tokens"))
            accepted.add_metric([model], _num(st, "spec_accepted_tokens"))
            ssd_bytes.add_metric([model], _num(st, "cache_ssd_written_bytes"))
            for reason in SSD_WRITE_REASONS:
                ssd_writes.add_metric([model, reason], _num(st, f"cache_ssd_written_{reason}"))
            prompt.add_metric([model], _num(st, "prompt_tokens"))
            gen.add_metric([model], _num(st, "generation_tokens"))
            hit_tokens.add_metric([model], _num(st, "cache_hit_tokens"))
            for tier in CACHE_TIERS:
                hits.add_metric([model, tier], _num(st, f"cache_{tier}_hits"))
                misses.add_metric([model, tier], _num(st, f"cache_{tier}_misses"))
                size.add_metric([model, tier], _num(st, f"cache_{tier}_bytes"))
                entries.add_metric([model, tier], _num(st, f"cache_{tier}_entries"))
            for event, key in CACHE_EVENTS:
                events.add_metric([model, event], _num(st, key))
        yield from (prompt, gen, hits, misses, size, hit_tokens, entries, events)
        yield from (ssd_bytes, ssd_writes, drafted, accepted, queue, admitted, preempted)


def _num(stats: dict, key: str) -> float:
    value = stats.get(key, 0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def route_label(request: web.Request) -> str:
    if request.path in PUBLIC_PATHS:  # as themselves; others by template (bounded labels)
        return request.path
    route = request.match_info.route if request.match_info is not None else None
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def observe_middleware(request: web.Request, handler):
    """Bind the request's log fields; count it and time it (TTFT for streams) as it ends."""
    token = bind_log_context(request_id=request.get("request_id"))
    metrics: Metrics = request.app[METRICS]
    t0 = time.monotonic()
    first: list[float] = []
    # The proxy calls this once the chunk with the worker's first-token marker is written.
    request[ON_FIRST_TOKEN] = lambda: first.append(time.monotonic() - t0)
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = 499  # the client went away
        raise
    finally:
        model, route = request.get("model") or "", route_label(request)
        metrics.requests.labels(model, route, str(status)).inc()
        metrics.latency.labels(model, route).observe(time.monotonic() - t0)
        if first:
            metrics.ttft.labels(model, route).observe(first[0])
        if seconds := request.get(AUDIO_SECONDS):
            metrics.audio.labels(model, route).inc(seconds)
        reset_log_context(token)


async def metrics_handler(request: web.Request) -> web.Response:
    body = await request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_metrics(app: web.Application) -> None:
    """Give the app its Prometheus registry and GET /metrics (add observe_middleware too)."""
    app[METRICS] = Metrics(app["registry"])
    app.router.add_get("/metrics", metrics_handler)
