// What the pages share: number formatting and filling a table's body.
"use strict";

function fmt(x, digits = 1) {
  if (x === null || x === undefined) return "–";
  if (Math.abs(x) >= 1000) return Math.round(x).toLocaleString("en");
  return Number.isInteger(x) ? String(x) : x.toFixed(digits);
}

function setText(id, text) { document.getElementById(id).textContent = text; }

// rows -> <tbody> of table `id`: cells(row) gives [text, class?] per cell; `empty` when no row
function fill(id, rows, cells, empty) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) {
    const td = body.insertRow().insertCell();
    td.colSpan = document.querySelector(`#${id} thead tr`).cells.length;
    td.className = "empty";
    td.textContent = empty;
    return;
  }
  for (const row of rows) {
    const tr = body.insertRow();
    for (const [text, cls] of cells(row)) {
      const td = tr.insertCell();
      td.textContent = text;
      if (cls) td.className = cls;
    }
  }
}

// The JS libraries come from npm (fence/web/node_modules, served under /vendor/): on a server
// where `npm ci` has not run, their <script> is a 404 and their global is not defined. A page
// asks before it draws; when missing, the boxes `ids` get a message in place of the `what`
// ("map", "charts") and the status line says so. Returns true when the library is missing.
function libraryMissing(global, name, path, ids, what) {
  if (typeof globalThis[global] !== "undefined") return false;
  for (const id of ids) {
    const el = document.getElementById(id);
    if (!el) continue;
    const box = document.createElement("div");
    box.className = "nolib";
    box.setAttribute("role", "alert");
    const title = document.createElement("strong");
    title.textContent = `${name} did not load`;
    const code = document.createElement("code");
    code.textContent = path;
    box.append(title, " (", code, ` was not served), so the ${what} cannot be drawn. On the server, ` +
               "run `bash deploy/setup.sh` (or `npm ci` in fence/web), then restart the API.");
    el.replaceChildren(box);
  }
  libraryNote(name, what);
  return true;
}

// The status line says a library is missing: in place of "loading…", or after what a page
// wrote there (pages that rewrite their status call this again).
function libraryNote(name, what) {
  const status = document.getElementById("status");
  if (!status) return;
  const note = `${name} did not load: no ${what}`;
  const now = status.textContent.trim();
  status.textContent = !now || now === "loading…" || now === note ? note : `${now} · ${note}`;
  status.classList.add("error");
}
