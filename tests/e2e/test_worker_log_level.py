"""The daemon's log level reaches its workers (it travels in their WorkerSpec)."""

from __future__ import annotations

import json

MSG = [{"role": "user", "content": "hello"}]
ENDS = ("<|im_end|>", "<|endoftext|>")


def _no_end_bias(d) -> dict[str, float]:
    """Ban the model's end tokens: the request then always decodes its 2 tokens (a random
    model's second token can be a near tie with the end of the turn)."""
    added = json.loads((d.home / "models" / "a" / "tokenizer.json").read_text())["added_tokens"]
    return {str(t["id"]): -100.0 for t in added if t["content"] in ENDS}


def _worker_log_after_a_request(d) -> str:
    r = d.openai().chat.completions.create(
        model="a", messages=MSG, max_tokens=2, logit_bias=_no_end_bias(d)
    )
    assert r.usage.completion_tokens == 2
    log = d.home / "logs" / "a.log"
    # The access line comes through the log pipe after the response: wait for it.
    d.wait_for(
        lambda: log.is_file() and "POST /v1/chat/completions 200" in log.read_text(),
        what="the worker's access line",
    )
    return log.read_text()


def test_log_level_debug_reaches_the_worker(make_daemon):
    d = make_daemon(args=["--log-level", "DEBUG"])
    text = _worker_log_after_a_request(d)
    assert " DEBUG [worker a] " in text
    assert '"log_level":"DEBUG"' in text  # the worker logs the spec it was started with


def test_default_info_keeps_debug_lines_out(make_daemon):
    d = make_daemon()
    text = _worker_log_after_a_request(d)
    assert " INFO [worker a] " in text
    assert " DEBUG " not in text


def test_the_flag_wins_over_the_environment_for_workers_too(make_daemon):
    d = make_daemon(env={"MLXD_LOG_LEVEL": "DEBUG"}, args=["--log-level", "INFO"])
    assert " DEBUG " not in _worker_log_after_a_request(d)


def test_polled_stats_stay_out_of_the_worker_log_at_info(make_daemon):
    # The dashboard polls /metrics and /admin/stats every 2 s; each fans out GET /stats to the
    # worker. Those must not fill its log, while a real request still logs its line.
    d = make_daemon()
    _worker_log_after_a_request(d)
    for _ in range(3):
        assert d.http.get("/admin/stats").json()["workers"]["a"]["status"] == 200
        assert d.http.get("/metrics").status_code == 200
    d.openai().chat.completions.create(model="a", messages=MSG, max_tokens=2)
    log = d.home / "logs" / "a.log"
    # A request after the polls: once its line is in, theirs would be too.
    d.wait_for(
        lambda: log.read_text().count("POST /v1/chat/completions 200") == 2,
        what="the second access line",
    )
    text = log.read_text()
    assert "GET /stats" not in text
    assert "GET /health" not in text


def test_polled_stats_are_still_there_at_debug(make_daemon):
    d = make_daemon(args=["--log-level", "DEBUG"])
    _worker_log_after_a_request(d)
    assert d.http.get("/admin/stats").status_code == 200
    d.wait_for(
        lambda: "GET /stats 200" in (d.home / "logs" / "a.log").read_text(),
        what="the /stats line at debug",
    )
