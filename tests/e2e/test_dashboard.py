"""The web dashboard in a real headless Chromium against a real daemon (docs/dashboard.md).

Needs Debian's `chromium` (apt-get install chromium) and the `playwright` package; the browser
tests skip without them. Screenshots of each page go to tests/artifacts/dashboard/.
"""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from fake_hub import FakeHub

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "dashboard"
TOKEN = "dash-admin-token-7f3e"
CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
# b's request defaults (its config section): the playground must start from them.
B_DEFAULTS = '[models.b]\ntemperature = 0\ntop_p = 0.9\nmax_tokens = 1\nsystem = "You are terse."\n'
HTML = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"  # Chromium's Accept


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def hub(tiny_model_dir):
    """A local Hugging Face hub for the Add panel's pulls (tests/fake_hub.py)."""
    h = FakeHub()
    for repo in ("test-org/tiny", "test-org/held"):
        h.add(repo, tiny_model_dir)
    yield h
    h.close()


@pytest.fixture(scope="module")
def daemon(make_module_daemon, hub, tmp_path_factory):
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path_factory.mktemp("hf-home"))}
    return make_module_daemon(config="[models.a]\nkeep_alive_s = 600\n" + B_DEFAULTS, env=env)


@pytest.fixture(scope="module")
def browser():
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=binary, headless=True)
        yield b
        b.close()


class Page:
    """A fresh browser tab on the daemon, recording what the console complained about."""

    def __init__(self, browser, url: str):
        self.ctx = browser.new_context(viewport={"width": 1280, "height": 720})
        self.page = self.ctx.new_page()
        self.url = url
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on(
            "console", lambda m: m.type == "error" and self.errors.append(m.text)
        )  # CSP violations and failed scripts land here

    def open(self, tab: str) -> None:
        self.page.goto(f"{self.url}/ui#{tab}")

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        print(f"screenshot: {ARTIFACTS / name}.png")


@pytest.fixture
def tab(browser, daemon):
    from playwright.sync_api import expect

    p = Page(browser, daemon.url)
    p.page.set_default_timeout(30_000)
    expect.set_options(timeout=30_000)
    yield p
    p.ctx.close()
    assert not p.errors, p.errors


def _ys(points: str | None) -> list[float]:
    """The y values of a sparkline's points (the SVG's y grows downwards: 58 is zero)."""
    return [float(p.split(",")[1]) for p in (points or "0,58").split()]


def state_of(page, model: str):
    return page.locator(f'#models-table tr[data-model="{model}"] .state')


def test_root_is_the_page_for_browsers_and_text_for_probes(daemon):
    plain = daemon.http.get("/")
    assert plain.status_code == 200 and plain.text == "Ollama is running"
    assert daemon.http.head("/").status_code == 200
    page = daemon.http.get("/", headers={"Accept": HTML})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.text == daemon.http.get("/ui").text and "/ui/app.js" in page.text
    js = daemon.http.get("/ui/app.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert js.headers["x-content-type-options"] == "nosniff"
    assert daemon.http.get("/ui/../config.toml").status_code in (400, 404)
    assert daemon.http.get("/ui/secret.txt").status_code == 404


def test_models_table_shows_a_loaded_model(tab, daemon):
    from playwright.sync_api import expect

    assert daemon.http.post("/admin/models/a/load").json()["model"]["state"] == "ready"
    tab.open("models")
    expect(state_of(tab.page, "a")).to_have_text("ready")
    pid = str(daemon.worker_pids("a")[0])
    expect(tab.page.locator('#models-table tr[data-model="a"] td').nth(2)).to_have_text(pid)
    expect(tab.page.locator('#models-table tr[data-model="a"] td.keepalive')).to_contain_text(
        "unloads in"
    )
    expect(state_of(tab.page, "b")).to_have_text("stopped")
    tab.shot("models")


def test_unload_button_stops_the_model(tab, daemon):
    from playwright.sync_api import expect

    daemon.http.post("/admin/models/a/load")
    tab.open("models")
    expect(state_of(tab.page, "a")).to_have_text("ready")
    tab.page.locator('#models-table tr[data-model="a"] button[data-action="unload"]').click()
    expect(state_of(tab.page, "a")).to_have_text("stopped")
    expect(tab.page.locator("#notice")).to_contain_text("a: unloaded")
    assert daemon.http.get("/admin/models/a").json()["state"] == "stopped"
    assert daemon.worker_pids("a") == []


def test_load_button_shows_the_phase_and_seconds_while_it_waits(tab, daemon):
    from playwright.sync_api import expect

    daemon.http.post("/admin/models/a/unload")
    tab.open("models")
    expect(state_of(tab.page, "a")).to_have_text("stopped")
    tab.page.locator('#models-table tr[data-model="a"] button[data-action="load"]').click()
    # The worker's start (interpreter, MLX import, weights, warm-up) takes seconds: the row
    # says which part, and for how long, before the answer comes.
    expect(state_of(tab.page, "a")).to_have_text(re.compile(r"^starting, [a-z ]+ \(\d+ s\)$"))
    expect(tab.page.locator("#notice")).to_contain_text("a: loaded")
    expect(state_of(tab.page, "a")).to_have_text("ready")


def test_add_panel_pulls_with_progress_cancels_and_deletes(tab, daemon, hub):
    from playwright.sync_api import expect

    hub.hold[("test-org/held", "model.safetensors")] = held = threading.Event()
    tab.open("models")
    tab.page.click("#add summary")
    expect(tab.page.locator('#add-names option[value="qwen3:0.6b"]')).to_have_count(1)
    tab.page.fill("#add-name", "test-org/held")
    tab.page.click("#add-pull")
    expect(tab.page.locator("#add-status")).to_contain_text("pulling model.safetensors")
    tab.page.click("#add-cancel")  # half the weights came; the rest is held back
    expect(tab.page.locator("#add-status")).to_contain_text("cancelled")
    held.set()
    daemon.wait_for(lambda: "pull of model=test-org/held cancelled" in daemon.logs())
    assert tab.page.locator('#models-table tr[data-model="test-org/held"]').count() == 0

    tab.page.fill("#add-name", "test-org/tiny")
    tab.page.click("#add-pull")
    expect(tab.page.locator("#add-status")).to_have_text("test-org/tiny: pulled")
    assert tab.page.locator("#add-progress").evaluate("p => p.value") == 1
    row = tab.page.locator('#models-table tr[data-model="test-org/tiny"]')
    expect(row.locator(".state")).to_have_text("stopped")
    tab.shot("models-add")
    tab.page.once("dialog", lambda d: d.accept())  # "Delete test-org/tiny from this machine?"
    row.locator('button[data-action="delete"]').click()
    expect(tab.page.locator("#notice")).to_contain_text("test-org/tiny: deleted")
    expect(row).to_have_count(0)
    assert not (daemon.home / "models" / "test-org" / "tiny").exists()


def test_playground_streams_a_reply(tab, daemon):
    from playwright.sync_api import expect

    tab.open("chat")
    expect(tab.page.locator('#chat-model option[value="a"]')).to_have_count(1)
    tab.page.select_option("#chat-model", "a")
    expect(tab.page.locator("#chat-defaults")).to_contain_text("a's defaults")  # then edit them
    tab.page.fill("#chat-max", "8")
    tab.page.fill("#chat-temp", "0")
    tab.page.fill("#chat-input", "Say hello")
    tab.page.click("#chat-send")
    expect(tab.page.locator("#chat-stats")).to_contain_text("tokens/s")
    reply = tab.page.locator(".msg.assistant .text").first
    assert reply.inner_text().strip()  # the streamed text stayed on the page
    expect(tab.page.locator(".msg.user")).to_contain_text("Say hello")
    assert daemon.http.get("/admin/models/a").json()["state"] == "ready"  # it loaded a
    tab.shot("playground")


def _chat_request(page):
    """Click Send; the JSON body the page posted to /v1/chat/completions."""
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as req:
        page.click("#chat-send")
    return req.value.post_data_json


def test_playground_starts_from_the_models_defaults_and_marks_a_cut_reply(tab, daemon):
    from playwright.sync_api import expect

    tab.open("chat")
    expect(tab.page.locator('#chat-model option[value="b"]')).to_have_count(1)
    tab.page.select_option("#chat-model", "b")
    expect(tab.page.locator("#chat-defaults")).to_contain_text("b's defaults")
    # b's own defaults are shown and editable, not the page's
    expect(tab.page.locator("#chat-temp")).to_have_value("0")
    expect(tab.page.locator("#chat-top-p")).to_have_value("0.9")
    expect(tab.page.locator("#chat-top-k")).to_have_value("0")
    expect(tab.page.locator("#chat-max")).to_have_value("1")
    expect(tab.page.locator("#chat-system")).to_have_value("You are terse.")
    tab.page.fill("#chat-input", "Say hello")
    sent = _chat_request(tab.page)
    # fields left at the defaults are not sent: the model's own apply
    assert set(sent) == {"model", "messages", "stream", "stream_options"}, sent
    assert sent["messages"] == [{"role": "user", "content": "Say hello"}]
    api = daemon.http.post(
        "/v1/chat/completions", json={"model": "b", "messages": sent["messages"]}
    )
    assert api.status_code == 200, api.text + daemon.logs()[-3000:]
    choice = api.json()["choices"][0]
    assert choice["finish_reason"] == "length"  # max_tokens = 1
    first = tab.page.locator(".msg.assistant").first
    expect(first.locator(".finish")).to_have_attribute("data-finish", "length")
    expect(first.locator(".finish")).to_contain_text("max_tokens")
    assert first.locator(".text").text_content() == choice["message"]["content"]  # greedy
    # an edited field is sent, the others still are not; a new system prompt goes first
    tab.page.fill("#chat-temp", "0.5")
    tab.page.fill("#chat-system", "Answer in French.")
    tab.page.fill("#chat-input", "Again")
    sent = _chat_request(tab.page)
    assert sent["temperature"] == 0.5 and "top_p" not in sent and "max_tokens" not in sent
    assert sent["messages"][0] == {"role": "system", "content": "Answer in French."}
    expect(tab.page.locator(".msg.assistant .finish")).to_have_count(2)
    tab.page.click("#chat-reset")
    expect(tab.page.locator("#chat-temp")).to_have_value("0")
    expect(tab.page.locator("#chat-system")).to_have_value("You are terse.")
    tab.shot("playground-defaults")


def test_playground_marks_a_reply_the_user_stopped(tab, daemon):
    from playwright.sync_api import expect

    tab.open("chat")
    expect(tab.page.locator('#chat-model option[value="a"]')).to_have_count(1)
    tab.page.select_option("#chat-model", "a")
    expect(tab.page.locator("#chat-defaults")).to_contain_text("a's defaults")
    tab.page.fill("#chat-max", "3000")
    tab.page.fill("#chat-temp", "0")
    tab.page.fill("#chat-input", "Tell me a long story")
    tab.page.click("#chat-send")
    expect(tab.page.locator(".msg.assistant .text")).not_to_be_empty()  # it is streaming
    tab.page.click("#chat-stop")
    mark = tab.page.locator(".msg.assistant .finish")
    expect(mark).to_have_attribute("data-finish", "stopped")
    expect(mark).to_have_text("stopped")


def test_logs_view_follows_a_worker_log(tab, daemon):
    from playwright.sync_api import expect

    tab.open("logs")
    expect(tab.page.locator('#logs-model option[value="b"]')).to_have_count(1)
    tab.page.select_option("#logs-model", "b")
    expect(tab.page.locator("#logs-file")).to_have_text("b.log")
    # b starts after the page follows its log: its first lines must arrive through the stream.
    loader = threading.Thread(target=lambda: daemon.http.post("/admin/models/b/load"))
    loader.start()
    expect(tab.page.locator("#logs-out")).to_contain_text("listening model=b")
    loader.join()
    tab.shot("logs")


def test_memory_cache_and_metrics_pages(tab, daemon):
    from playwright.sync_api import expect

    for _ in range(2):  # some traffic for the cache
        assert daemon.http.post("/v1/chat/completions", json=CHAT).status_code == 200
    tab.open("memory")
    expect(tab.page.locator('#memory-table tr[data-model="a"]')).to_contain_text("ready")
    expect(tab.page.locator("#budget-text")).to_contain_text("budget in use")
    expect(tab.page.locator("#eviction-text")).not_to_be_empty()
    tab.shot("memory")
    tab.open("cache")
    expect(tab.page.locator('#cache-table tr[data-model="a"]')).to_have_count(1)
    tab.shot("cache")
    tab.open("metrics")
    expect(tab.page.locator("#s-tps polyline")).to_have_count(1)  # two polls made a point
    expect(tab.page.locator("#m-rps")).not_to_have_text("–")
    for _ in range(3):  # streamed, so TTFT is observed too
        with daemon.http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status_code == 200 and "[DONE]" in r.read().decode()
    # the generated tokens show up as a rise in the tokens/s line once the next poll ran
    line = tab.page.locator("#s-tps polyline")
    daemon.wait_for(lambda: min(_ys(line.get_attribute("points"))) < 57, what="a tokens/s rise")
    expect(tab.page.locator("#m-ttft")).not_to_have_text("–")
    tab.shot("metrics")


def test_every_view_shows_one_memory_figure(tab, daemon, capsys):
    """mlxctl ps, show and fit, /admin/memory, Ollama's /api/ps and the dashboard's two tables
    show a loaded model's memory as one figure: the worker's report, with units."""
    from playwright.sync_api import expect

    from mlxd.shared.sizes import format_size
    from mlxd.supervisor.ctl.mlxctl import main as mlxctl

    assert daemon.http.post("/admin/models/a/load").json()["model"]["state"] == "ready"
    cached = daemon.http.get("/admin/models/a").json()["memory"]["prompt_cache_bytes"]
    ask = {**CHAT, "messages": [{"role": "user", "content": "a prompt new to the cache"}]}
    assert daemon.http.post("/v1/chat/completions", json=ask).status_code == 200
    daemon.wait_for(  # the watchdog's next /health probe brings the new entry into the report
        lambda: daemon.http.get("/admin/models/a").json()["memory"]["prompt_cache_bytes"] > cached,
        what="a report with the new cache entry",
    )  # nothing else runs: from here the figures hold still
    mem = daemon.http.get("/admin/models/a").json()["memory"]
    assert mem["reported"] and mem["weights_bytes"] > 0
    total = mem["weights_bytes"] + mem["prompt_cache_bytes"] + mem["kv_reserved_bytes"]
    assert mem["total_bytes"] == total
    text = format_size(total)

    admin = daemon.http.get("/admin/memory").json()
    assert next(m for m in admin["models"] if m["id"] == "a")["memory"] == mem
    ollama = next(
        m for m in daemon.http.get("/api/ps").json()["models"] if m["model"] in ("a", "a:latest")
    )
    assert ollama["size"] == ollama["size_vram"] == total
    ctl = ["--url", daemon.url, "--home", str(daemon.home)]
    capsys.readouterr()
    assert mlxctl([*ctl, "ps"]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("a "))
    assert row.split()[3:5] == text.split()  # the MEMORY column
    assert mlxctl([*ctl, "fit", "a"]) == 0
    assert f"holds {text}: weights {format_size(mem['weights_bytes'])}" in capsys.readouterr().out

    tab.open("models")
    expect(tab.page.locator('#models-table tr[data-model="a"] td').nth(3)).to_have_text(text)
    tab.open("memory")
    row_a = tab.page.locator('#memory-table tr[data-model="a"]')
    expect(row_a.locator("td.mem-total")).to_have_text(text)
    expect(row_a.locator("td").nth(3)).to_have_text(format_size(mem["weights_bytes"]))
    expect(row_a.locator("td").nth(4)).to_have_text(format_size(mem["prompt_cache_bytes"]))
    tab.shot("memory-agrees")


def test_with_an_admin_token_the_page_asks_for_it(browser, make_module_daemon, tiny_model_dir):
    from playwright.sync_api import expect

    d = make_module_daemon(models={"a": tiny_model_dir}, env={"MLXD_ADMIN_TOKEN": TOKEN})
    for path in ("/ui", "/ui/app.js", "/ui/app.css"):  # the page carries no secret
        assert TOKEN not in d.http.get(path).text
    assert d.http.get("/admin/models").status_code == 401
    p = Page(browser, d.url)
    try:
        p.open("models")
        expect(p.page.locator("#auth")).to_be_visible()
        expect(p.page.locator("#auth-why")).to_contain_text("admin token")
        expect(p.page.locator("#models-table tbody tr")).to_have_count(0)
        p.page.fill("#auth-admin", TOKEN)
        p.page.click('#auth-form button[type="submit"]')
        expect(state_of(p.page, "a")).to_have_text("stopped")
        expect(p.page.locator("#auth")).to_be_hidden()
        stored = p.page.evaluate("sessionStorage.getItem('mlxd.admin_token')")
        assert stored == TOKEN
        # the only console errors are the refused requests before the token was given
        assert all("401" in e for e in p.errors), p.errors
    finally:
        p.ctx.close()
    with httpx.Client(base_url=d.url) as c:  # the token opens /admin, as the page sent it
        assert c.get("/admin/models", headers={"Authorization": f"Bearer {TOKEN}"}).is_success
