"""The public routes are declared once (shared/routes.py): the supervisor serves each, sends
each to the right kind of model, forwards the plain ones, and labels each in the metrics."""

from __future__ import annotations

from fake_workers import Fleet, make_registry

from mlxd.shared.routes import (
    BY_PATH,
    FORWARDED_PATHS,
    PUBLIC_PATHS,
    ROUTES,
    WORKER_CHAT_PATHS,
    WORKER_PATHS,
    in_area,
    kind_of,
)
from mlxd.supervisor.daemon import build_app
from mlxd.supervisor.http.routes import proxy_v1


def _posts(app) -> dict[str, object]:
    return {
        r.resource.canonical: r.handler
        for r in app.router.routes()
        if r.method == "POST" and r.resource is not None
    }


def test_the_supervisor_serves_every_public_route_and_forwards_the_plain_ones(tmp_path):
    reg = make_registry(tmp_path, Fleet(), "a")
    posts = _posts(build_app(reg.settings, reg))
    assert PUBLIC_PATHS <= set(posts)
    for path in PUBLIC_PATHS:
        assert (posts[path] is proxy_v1) == (path in FORWARDED_PATHS), path


def test_each_route_names_a_worker_path_of_its_own_kind():
    assert {r.worker_path for r in ROUTES} == WORKER_PATHS
    for r in ROUTES:
        assert r.worker_path in WORKER_PATHS
        assert kind_of(r.worker_path) == r.kind, r
        assert (r.worker_path in WORKER_CHAT_PATHS) == (r.kind == "chat")
        assert in_area(r.path, ("/v1", "/api"))
    assert kind_of("/api/embed") == "embedding" and kind_of("/api/chat") == "chat"
    assert BY_PATH["/api/embeddings"].worker_path == "/v1/embeddings"


def test_areas_are_whole_path_segments():
    assert in_area("/admin", ("/admin",)) and in_area("/admin/models", ("/admin",))
    assert not in_area("/administrator", ("/admin",))
