"""The scrape-time families built from the workers' /stats (no daemon: the collector alone)."""

from __future__ import annotations

from mlxd.supervisor.admin.metrics import ScrapeCollector


def _samples(workers: dict[str, dict]) -> dict[str, dict[tuple, float]]:
    collector = ScrapeCollector.__new__(ScrapeCollector)  # the worker half reads no registry
    collector.workers = workers
    out: dict[str, dict[tuple, float]] = {}
    for family in collector._worker_families():
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_preemptions_are_counted_per_model():
    got = _samples({"a": {"preemptions": 3}, "b": {}})
    assert got["mlxd_engine_preemptions_total"] == {
        (("model", "a"),): 3.0,
        (("model", "b"),): 0.0,  # an older worker without the figure reads as none
    }


def test_a_reply_splice_is_a_prompt_cache_event():
    got = _samples({"a": {"cache_reply_splices": 2}})
    events = got["mlxd_prompt_cache_events_total"]
    assert events[(("event", "reply_splice"), ("model", "a"))] == 2.0
