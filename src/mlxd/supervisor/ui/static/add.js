// mlxd dashboard, Models → Add a model: pull a model by name with a progress bar, cancel it,
// delete a model. Ollama's own routes (/api/pull, /api/delete; docs/api.md) through app.js's
// call(), which sends the admin token; nothing here the API does not do.
"use strict";

let pullAbort = null;

function addStatus(text) { $("add-status").textContent = text; }

// A pull's NDJSON lines (app.js's readBlocks): one progress bar over every file's bytes.
async function readLines(resp, onLine) {
  await readBlocks(resp, "\n", (text) => { if (text.trim()) onLine(JSON.parse(text)); });
}

async function pullModel(ev) {
  ev.preventDefault();
  const name = $("add-name").value.trim();
  if (!name || pullAbort) return;
  const abort = (pullAbort = new AbortController());
  const bar = $("add-progress");
  const files = new Map(); // digest → [completed, total]
  bar.hidden = false;
  bar.value = 0;
  $("add-pull").disabled = true;
  $("add-cancel").disabled = false;
  addStatus(`pulling ${name}…`);
  let failed = null;
  try {
    const resp = await call("/api/pull", { method: "POST", json: { model: name }, signal: abort.signal });
    await readLines(resp, (line) => {
      if (line.error) { failed = line.error; return; }
      if (line.digest && line.total) files.set(line.digest, [line.completed || 0, line.total]);
      let done = 0, total = 0;
      for (const [c, t] of files.values()) { done += c; total += t; }
      if (total) bar.value = done / total;
      addStatus(total ? `${line.status}: ${bytes(done)} of ${bytes(total)}` : line.status);
      if (line.status === "success") bar.value = 1;
    });
    if (failed) throw new Error(failed);
    addStatus(`${name}: pulled`);
    notice(`${name}: pulled`, true);
  } catch (e) {
    if (abort.signal.aborted) {
      addStatus(`${name}: cancelled (pull again to go on where it stopped)`);
    } else {
      addStatus(`${name}: ${e.message}`);
      notice(`pull ${name}: ${e.message}`);
    }
  } finally {
    pullAbort = null;
    $("add-pull").disabled = false;
    $("add-cancel").disabled = true;
    await loadModels().catch(() => {});
  }
}

function deleteButton(id) {
  return el("button", { type: "button", "data-action": "delete", onclick: () => deleteModel(id) },
    "Delete");
}

async function deleteModel(id) {
  if (!window.confirm(`Delete ${id} from this machine? (A loaded model is unloaded first.)`)) return;
  try {
    await call("/api/delete", { method: "DELETE", json: { model: id } });
    notice(`${id}: deleted`, true);
  } catch (e) {
    notice(`delete ${id}: ${e.message}`);
  }
  await loadModels().catch(() => {});
}

async function loadPullNames() {
  const names = (await (await call("/admin/pull-names")).json()).names;
  $("add-names").replaceChildren(...names.map((n) => el("option", { value: n.name }, n.repo)));
}

window.addEventListener("DOMContentLoaded", () => {
  $("add-form").addEventListener("submit", pullModel);
  $("add-cancel").addEventListener("click", () => pullAbort && pullAbort.abort());
  $("add").addEventListener("toggle", () => {
    if ($("add").open && !$("add-names").options.length) loadPullNames().catch(() => {});
  });
});
