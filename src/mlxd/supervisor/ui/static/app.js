// mlxd dashboard: plain DOM, no dependencies. Everything comes from the JSON admin API,
// /metrics and /v1 on this same origin; tokens live in sessionStorage, never in this file.
"use strict";

const POLL_MS = 2000; // models, memory and /metrics: one request each per 2 s at most
const HISTORY = 60; // sparkline points (2 minutes)
const MAX_LOG_LINES = 2000;
const store = window.sessionStorage;
const $ = (id) => document.getElementById(id);

// ---- helpers ---------------------------------------------------------------------------

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) node.append(kid);
  return node;
}

// Sizes print as shared/sizes.py's format_size prints them (mlxctl, errors): binary units, at
// most three significant figures, so the page and the terminal show the same text.
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  if (i === 0) return `${n.toFixed(0)} B`;
  let text = n.toFixed(Math.abs(n) < 10 ? 1 : 0);
  if (text === "1024" && i < units.length - 1) { text = "1"; i++; }
  return `${text.replace(/\.0$/, "")} ${units[i]}`;
}

// A model's memory (shared/wire/memory.py): the total the budget counts; "est." before the
// worker has reported.
const held = (mem) => (mem ? bytes(mem.total_bytes) + (mem.reported ? "" : " (est.)") : "–");

function seconds(s) {
  if (s === null || s === undefined) return "–";
  const whole = Math.round(s);
  if (whole < 60) return `${whole} s`;
  if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
  return `${(s / 3600).toFixed(1)} h`;
}

function modelPath(id) {
  return id.split("/").map(encodeURIComponent).join("/");
}

function notice(text, info) {
  const n = $("notice");
  n.hidden = !text;
  n.textContent = text || "";
  n.className = info ? "notice info" : "notice";
}

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// Ollama's routes that change the models on disk take the admin token, as /admin does.
const MANAGE = ["/api/pull", "/api/delete", "/api/copy", "/api/create"];

// Same-origin fetch with the right secret: the admin token for /admin, /metrics and MANAGE,
// the API key for /v1. A 401 opens the sign-in panel; the API's own error message is shown as
// is (OpenAI's envelope, or Ollama's {"error": "…"}).
async function call(path, opts = {}) {
  const admin = path.startsWith("/admin") || path.startsWith("/metrics") || MANAGE.includes(path);
  const secret = store.getItem(admin ? "mlxd.admin_token" : "mlxd.api_key");
  const headers = { ...(opts.headers || {}) };
  if (secret) headers.Authorization = `Bearer ${secret}`;
  if (opts.json !== undefined) {
    headers["Content-Type"] = "application/json";
    opts = { ...opts, body: JSON.stringify(opts.json) };
  }
  const resp = await fetch(path, { ...opts, headers, credentials: "omit", cache: "no-store" });
  if (!resp.ok) {
    let message = `${resp.status} ${resp.statusText}`;
    try {
      const err = (await resp.json()).error;
      message = (typeof err === "string" ? err : err.message) || message;
    } catch (e) { /* not JSON */ }
    if (resp.status === 401) askToken(message, admin);
    throw new HttpError(resp.status, message);
  }
  return resp;
}

// ---- sign in ---------------------------------------------------------------------------

function askToken(why, admin) {
  $("auth").hidden = false;
  $("auth-why").textContent = why;
  (admin ? $("auth-admin") : $("auth-api")).focus();
}

function setupAuth() {
  $("auth-open").addEventListener("click", () => { $("auth").hidden = !$("auth").hidden; });
  $("auth-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    for (const [key, input] of [["mlxd.admin_token", "auth-admin"], ["mlxd.api_key", "auth-api"]]) {
      const v = $(input).value.trim();
      if (v) store.setItem(key, v);
      $(input).value = "";
    }
    $("auth").hidden = true;
    notice("");
    refresh();
  });
  $("auth-clear").addEventListener("click", () => {
    store.removeItem("mlxd.admin_token");
    store.removeItem("mlxd.api_key");
    refresh();
  });
}

// ---- tabs ------------------------------------------------------------------------------

let current = "models";

function showTab() {
  const name = (location.hash || "#models").slice(1);
  current = document.getElementById(`tab-${name}`) ? name : "models";
  for (const s of document.querySelectorAll("section.tab")) s.hidden = s.id !== `tab-${current}`;
  for (const a of document.querySelectorAll("#tabs a")) {
    a.classList.toggle("active", a.dataset.tab === current);
  }
  if (current === "logs") startLogs(); else stopLogs();
  refresh();
}

// ---- models ----------------------------------------------------------------------------

let models = [];
let modelsAt = 0;
const pending = new Map(); // model id → the action under way
const ACTION_POLL_MS = 500; // the rows are read this often while an action is under way

async function loadModels() {
  const data = await (await call("/admin/models")).json();
  models = data.data;
  modelsAt = performance.now();
  renderModels();
  fillModelSelect($("logs-model"), models.map((m) => m.id));
}

function countdown(m) {
  if (m.keep_alive_s < 0 || m.pinned) return "never unloaded";
  if (m.expires_in_s === null) return m.state === "ready" ? "busy" : "–";
  const left = m.expires_in_s - (performance.now() - modelsAt) / 1000;
  return `unloads in ${seconds(Math.max(0, left))}`;
}

// A starting model says what its worker is doing and for how long (the row mlxctl load reads).
function stateText(m, busy) {
  if (m.state === "starting") {
    return `starting, ${m.phase || "waiting for the worker"} (${Math.round(m.load_s || 0)} s)`;
  }
  return busy ? `${busy}…` : m.state;
}

function renderModels() {
  const body = $("models-table").tBodies[0];
  body.replaceChildren(...models.map((m) => {
    const busy = pending.get(m.id);
    const buttons = ["load", "unload", "drain", "reload"].map((a) => el(
      "button",
      { type: "button", "data-action": a, onclick: () => act(m.id, a) },
      a[0].toUpperCase() + a.slice(1),
    ));
    if (m.source === "home") buttons.push(deleteButton(m.id)); // add.js
    if (busy) for (const b of buttons) b.disabled = true;
    return el("tr", { "data-model": m.id },
      el("td", {}, m.id),
      el("td", { class: "state-cell" },
        el("span", { class: `state state-${m.state}` }, stateText(m, busy)),
        m.drained ? el("span", { class: "muted" }, " (drained)") : null),
      el("td", { class: "num" }, m.pid === null ? "–" : String(m.pid)),
      el("td", { class: "num" }, held(m.memory)),
      el("td", { class: "num" }, String(m.leases)),
      el("td", { class: "num" }, String(m.queued)),
      el("td", { class: "keepalive" }, countdown(m)),
      el("td", { class: "num" }, String(m.restarts)),
      el("td", { class: "err" }, m.last_error || ""),
      el("td", {}, ...buttons));
  }));
}

function tickCountdowns() {
  const cells = $("models-table").querySelectorAll("td.keepalive");
  cells.forEach((cell, i) => { if (models[i]) cell.textContent = countdown(models[i]); });
}

async function act(id, action) {
  pending.set(id, action);
  renderModels();
  // The action answers when it is over: meanwhile the row is read often, so a load's
  // phase and seconds move on the page.
  const watch = setInterval(() => loadModels().catch(() => {}), ACTION_POLL_MS);
  try {
    const r = await (await call(`/admin/models/${modelPath(id)}/${action}`,
      { method: "POST", json: {} })).json();
    notice(`${id}: ${r.result} (${r.elapsed_s} s)`, true);
  } catch (e) {
    notice(`${action} ${id}: ${e.message}`);
  } finally {
    clearInterval(watch);
    pending.delete(id);
    await loadModels().catch(() => {});
  }
}

function fillModelSelect(select, ids) {
  const have = [...select.options].map((o) => o.value);
  if (have.join("\n") === ids.join("\n")) return;
  const keep = select.value;
  select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
  if (ids.includes(keep)) select.value = keep;
  select.dispatchEvent(new Event("change"));
}

// ---- memory ----------------------------------------------------------------------------

async function loadMemory() {
  const m = await (await call("/admin/memory")).json();
  const share = m.budget_bytes ? Math.min(100, (100 * m.used_bytes) / m.budget_bytes) : 0;
  $("budget-used").style.width = `${share.toFixed(1)}%`;
  $("budget-text").textContent = `${bytes(m.used_bytes)} of ${bytes(m.budget_bytes)} budget in use, `
    + `${bytes(m.free_bytes)} free` + (m.max_loaded_models ? `; at most ${m.max_loaded_models} models` : "");
  $("memory-table").tBodies[0].replaceChildren(...m.models.map((r) => el("tr", { "data-model": r.id },
    el("td", {}, r.id),
    el("td", {}, el("span", { class: `state state-${r.state}` }, r.state)),
    el("td", { class: "num mem-total" }, held(r.memory)),
    el("td", { class: "num" }, bytes(r.memory.weights_bytes)),
    el("td", { class: "num" }, bytes(r.memory.prompt_cache_bytes)),
    el("td", { class: "num" },
      `${bytes(r.memory.kv_in_use_bytes)} of ${bytes(r.memory.kv_reserved_bytes)}`),
    el("td", { class: "num" }, String(r.leases)),
    el("td", {}, seconds(r.idle_s)),
    el("td", {}, r.pinned ? "yes" : ""),
    el("td", {}, r.evictable ? `#${m.eviction_order.indexOf(r.id) + 1}` : "no"))));
  $("eviction-text").textContent = m.eviction_order.length
    ? `A load that does not fit evicts first: ${m.eviction_order.join(", then ")}.`
    : "No idle model can be evicted now: a load that does not fit waits for one.";
}

// ---- /metrics: prompt cache and sparklines ---------------------------------------------

function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

const sum = (rows, name, pred) => rows
  .filter((r) => r.name === name && (!pred || pred(r.labels)))
  .reduce((a, r) => a + r.value, 0);
const isApi = (l) => (l.route || "").startsWith("/v1/") || (l.route || "").startsWith("/api/");
const history = { tps: [], ttft: [], rps: [] };
let last = null;

async function loadMetrics() {
  const rows = parseMetrics(await (await call("/metrics")).text());
  const now = { t: performance.now() / 1000,
    gen: sum(rows, "mlxd_generation_tokens_total"),
    req: sum(rows, "mlxd_requests_total", isApi),
    ttftSum: sum(rows, "mlxd_time_to_first_token_seconds_sum"),
    ttftCount: sum(rows, "mlxd_time_to_first_token_seconds_count") };
  if (last) {
    const dt = Math.max(0.001, now.t - last.t);
    const n = now.ttftCount - last.ttftCount;
    push("tps", Math.max(0, now.gen - last.gen) / dt); // a restarted worker counts from 0
    push("rps", Math.max(0, now.req - last.req) / dt);
    push("ttft", n > 0 ? (now.ttftSum - last.ttftSum) / n : null);
  }
  last = now;
  renderCache(rows);
}

function push(key, value) {
  const h = history[key];
  h.push(value);
  if (h.length > HISTORY) h.shift();
  const shown = [...h].reverse().find((v) => v !== null);
  $(`m-${key}`).textContent = shown === undefined ? "–" : shown.toFixed(key === "ttft" ? 3 : 1);
  const values = h.map((v) => (v === null ? 0 : v));
  const top = Math.max(...values, key === "ttft" ? 0.01 : 1);
  const x0 = 300 - ((values.length - 1) * 300) / (HISTORY - 1); // the newest point at the right
  const points = values.map((v, i) => `${x0 + (i * 300) / (HISTORY - 1)},${58 - (v / top) * 56}`);
  const svg = $(`s-${key}`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points.join(" "));
  svg.replaceChildren(line);
}

function renderCache(rows) {
  const ids = [...new Set(rows.filter((r) => r.name === "mlxd_prompt_cache_bytes")
    .map((r) => r.labels.model))].sort();
  const of = (name, id, tier) => sum(rows, name, (l) => l.model === id && (!tier || l.tier === tier));
  const rate = (id, tier) => {
    const hits = of("mlxd_prompt_cache_hits_total", id, tier);
    const all = hits + of("mlxd_prompt_cache_misses_total", id, tier);
    return all ? `${((100 * hits) / all).toFixed(0)}% of ${all}` : "–";
  };
  $("cache-table").tBodies[0].replaceChildren(...ids.map((id) => el("tr", { "data-model": id },
    el("td", {}, id),
    el("td", { class: "num" }, String(of("mlxd_prompt_cache_entries", id, "ram"))),
    el("td", { class: "num" }, bytes(of("mlxd_prompt_cache_bytes", id, "ram"))),
    el("td", { class: "num" }, rate(id, "ram")),
    el("td", { class: "num" }, String(of("mlxd_prompt_cache_entries", id, "ssd"))),
    el("td", { class: "num" }, bytes(of("mlxd_prompt_cache_bytes", id, "ssd"))),
    el("td", { class: "num" }, rate(id, "ssd")),
    el("td", { class: "num" }, String(of("mlxd_prompt_cache_hit_tokens_total", id))))));
}

// ---- streamed bodies over fetch (EventSource cannot send the admin token) --------------

// A streamed body, cut into blocks at `sep` as they arrive (SSE: "\n\n"; NDJSON: "\n").
async function readBlocks(resp, sep, onBlock) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf(sep)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + sep.length);
      onBlock(block);
    }
  }
}

async function readEvents(resp, onEvent) {
  await readBlocks(resp, "\n\n", (block) => {
    let event = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (data.length) onEvent(event, data.join("\n"));
  });
}

// ---- logs ------------------------------------------------------------------------------

let logAbort = null;

function stopLogs() {
  if (logAbort) logAbort.abort();
  logAbort = null;
}

async function startLogs() {
  stopLogs();
  const model = $("logs-model").value;
  if (!model || current !== "logs") return;
  const abort = (logAbort = new AbortController());
  const out = $("logs-out");
  out.textContent = "";
  try {
    const resp = await call(`/admin/logs/stream?model=${encodeURIComponent(model)}&tail=200`,
      { signal: abort.signal });
    await readEvents(resp, (event, data) => {
      const body = JSON.parse(data);
      if (event === "file") $("logs-file").textContent = body.file;
      if (event !== "lines") return;
      const follow = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      out.append(...body.lines.map((l) => el("div", { class: "log-line" }, l)));
      while (out.childElementCount > MAX_LOG_LINES) out.firstElementChild.remove();
      if (follow) out.scrollTop = out.scrollHeight;
    });
  } catch (e) {
    if (abort.signal.aborted) return;
    notice(`logs: ${e.message}`);
  }
  if (!abort.signal.aborted) setTimeout(() => { if (logAbort === abort) startLogs(); }, 2000);
}

// ---- chat playground -------------------------------------------------------------------

let chat = [];
let chatAbort = null;

async function loadChatModels() {
  const data = await (await call("/v1/models")).json();
  fillModelSelect($("chat-model"), data.data.filter((m) => m.type !== "embedding").map((m) => m.id));
}

// The playground starts from the model's own request defaults (its config section over its
// generation_config.json, as its worker resolves them: /admin/models/{id}). A field left at
// its default (or emptied) is not sent, so the model's default applies, whatever it is.
const PARAMS = () => [...document.querySelectorAll("#chat-form input[data-param]")];
let chatDefaults = {};

async function loadChatDefaults() {
  const id = $("chat-model").value;
  if (!id) return;
  const detail = await (await call(`/admin/models/${modelPath(id)}`)).json();
  if ($("chat-model").value !== id) return; // another model was picked meanwhile
  chatDefaults = detail.sampling_defaults || {};
  resetChatParams();
}

function resetChatParams() {
  for (const input of PARAMS()) {
    const v = chatDefaults[input.dataset.param];
    input.value = v === null || v === undefined ? "" : String(v);
  }
  $("chat-system").value = chatDefaults.system || "";
  const max = chatDefaults.max_tokens;
  $("chat-defaults").textContent = `${$("chat-model").value}'s defaults`
    + (max === null || max === undefined ? "; max_tokens: up to the context's end" : "")
    + ". Fields left at them are not sent.";
}

// What the request carries besides the messages: only what differs from the model's defaults.
function chatParams() {
  const out = {};
  for (const input of PARAMS()) {
    const name = input.dataset.param;
    const d = chatDefaults[name];
    if (input.value === "" || (d !== null && d !== undefined && Number(input.value) === d)) continue;
    out[name] = Number(input.value);
  }
  return out;
}

function chatMessages() {
  const system = $("chat-system").value.trim();
  if (!system || system === (chatDefaults.system || "").trim()) return chat; // the model's own
  return [{ role: "system", content: system }, ...chat];
}

// The end of a reply, in words: a length cut or a stop the user pressed is marked.
const FINISH = {
  stop: "end of reply",
  length: "cut off: max_tokens reached",
  tool_calls: "ended with a tool call",
  stopped: "stopped",
};

function markFinish(node, reason) {
  if (!reason) return;
  node.append(el("div", { class: `finish finish-${reason}`, "data-finish": reason },
    FINISH[reason] || `finished: ${reason}`));
}

function bubble(role, text) {
  const body = el("span", { class: "text" }, text || "");
  const node = el("div", { class: `msg ${role}` }, el("span", { class: "who" }, role), body);
  $("chat-log").append(node);
  return { node, body };
}

async function send(ev) {
  ev.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || chatAbort) return;
  $("chat-input").value = "";
  chat.push({ role: "user", content: text });
  bubble("user", text);
  const reply = bubble("assistant", "");
  let reasoning = null;
  let answer = "";
  const abort = (chatAbort = new AbortController());
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  $("chat-stats").textContent = "waiting for the first token…";
  const t0 = performance.now();
  let first = null;
  let usage = null;
  let pieces = 0;
  let finish = null;
  try {
    const resp = await call("/v1/chat/completions", {
      method: "POST", signal: abort.signal,
      json: { model: $("chat-model").value, messages: chatMessages(), stream: true,
        stream_options: { include_usage: true }, ...chatParams() } });
    await readEvents(resp, (event, data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const choice = (chunk.choices && chunk.choices[0]) || {};
      if (choice.finish_reason) finish = choice.finish_reason;
      const delta = choice.delta || {};
      if (delta.reasoning_content) {
        if (!reasoning) {
          reasoning = el("div", { class: "reasoning" });
          reply.node.insertBefore(reasoning, reply.body);
        }
        reasoning.textContent += delta.reasoning_content;
      }
      if (delta.content) answer += delta.content;
      if (delta.content || delta.reasoning_content) {
        first = first || performance.now();
        pieces++;
        reply.body.textContent = answer;
        $("chat-log").scrollTop = $("chat-log").scrollHeight;
      }
    });
    chat.push({ role: "assistant", content: answer });
    markFinish(reply.node, finish);
  } catch (e) {
    if (abort.signal.aborted) markFinish(reply.node, "stopped");
    else reply.node.append(el("div", { class: "msg error" }, e.message));
    chat.pop();
  } finally {
    const end = performance.now();
    const tokens = usage ? usage.completion_tokens : pieces;
    const gen = first ? (end - first) / 1000 : 0;
    $("chat-stats").textContent = first
      ? `${tokens} tokens, ${gen > 0 ? (tokens / gen).toFixed(1) : "–"} tokens/s, `
        + `first token after ${((first - t0) / 1000).toFixed(2)} s`
      : "";
    chatAbort = null;
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}

function setupChat() {
  $("chat-form").addEventListener("submit", send);
  $("chat-stop").addEventListener("click", () => chatAbort && chatAbort.abort());
  $("chat-clear").addEventListener("click", () => { chat = []; $("chat-log").replaceChildren(); });
  $("chat-reset").addEventListener("click", resetChatParams);
  $("chat-model").addEventListener("change", () => {
    loadChatDefaults().catch((e) => notice(`model defaults: ${e.message}`));
  });
  $("chat-input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) send(ev);
  });
}

// ---- polling ---------------------------------------------------------------------------

let busy = false;

async function refresh() {
  if (busy || document.hidden) return;
  busy = true;
  try {
    const jobs = [loadModels(), loadMetrics()];
    if (current === "memory") jobs.push(loadMemory());
    if (current === "chat" && !$("chat-model").options.length) jobs.push(loadChatModels());
    const failed = (await Promise.allSettled(jobs)).filter((r) => r.status === "rejected");
    $("conn").textContent = failed.length ? "" : `updated ${new Date().toLocaleTimeString()}`;
    if (failed.length && failed[0].reason.status !== 401) notice(failed[0].reason.message);
  } finally {
    busy = false;
  }
}

window.addEventListener("DOMContentLoaded", () => {
  setupAuth();
  setupChat();
  $("logs-model").addEventListener("change", () => { if (current === "logs") startLogs(); });
  $("cache-flush").addEventListener("click", async () => {
    try {
      const r = await (await call("/admin/cache/flush", { method: "POST", json: {} })).json();
      notice(`flushed: ${r.flushed.join(", ") || "none"}`, true);
    } catch (e) { notice(`flush: ${e.message}`); }
  });
  window.addEventListener("hashchange", showTab);
  showTab();
  setInterval(refresh, POLL_MS);
  setInterval(tickCountdowns, 1000);
});
