// What the pages share: number formatting, filling a table's body, the message for a missing
// library, and signing in. Every string from the server goes into the page as text
// (textContent, text nodes), never as markup.
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
const libraryNotes = new Map(); // name -> what: said again after the status line is rewritten

function libraryNote(name, what) {
  libraryNotes.set(name, what);
  const status = document.getElementById("status");
  if (!status) return;
  const note = `${name} did not load: no ${what}`;
  const now = status.textContent.trim();
  status.textContent = !now || now === "loading…" || now === note ? note : `${now} · ${note}`;
  status.classList.add("error");
}

// --------------------------------------------------------------------------- signing in
// The pages hold no data: what they show comes from routes that need a Firebase ID token
// (fence/page_data.py, the owner's routes). A page calls startSignIn(onSignedIn): the token of a
// link (#token=..., the app opening the page; taken out of the address bar at once) or of this
// tab's session (sessionStorage), else the sign-in form (#signin: email and password through
// Firebase Auth's REST API, the Auth emulator on the local stack: /pages/config says where).
// Until then the page shows the form and nothing else (the elements marked data-signed-in stay
// hidden); a 401 later (an expired token) shows the form again. The tenant a request acts in
// (a member of several names one) goes in the X-Geofence-Tenant header (gfAuth.tenant).

const TOKEN_KEY = "geofence-token";
const gfAuth = { token: null, tenant: null, onSignedIn: null, onSignedOut: null };

class SignedOut extends Error {}

let pagesConfigCache = null;
async function pagesConfig() {
  if (!pagesConfigCache) {
    const r = await fetch("/pages/config", { cache: "no-store" });
    if (!r.ok) throw new Error(`/pages/config: HTTP ${r.status}`);
    pagesConfigCache = await r.json();
  }
  return pagesConfigCache;
}

// email + password -> an ID token (Firebase Auth's REST API, or the emulator's)
async function signInWithPassword(email, password) {
  const cfg = await pagesConfig();
  const base = cfg.auth.emulator ? `${cfg.auth.emulator}/identitytoolkit.googleapis.com`
    : "https://identitytoolkit.googleapis.com";
  const r = await fetch(`${base}/v1/accounts:signInWithPassword?key=${encodeURIComponent(cfg.auth.api_key)}`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ email, password, returnSecureToken: true }),
  });
  let body = {};
  try { body = await r.json(); } catch (e) { body = {}; }
  if (!r.ok) throw new Error(body.error && body.error.message ? String(body.error.message) : `HTTP ${r.status}`);
  return body.idToken;
}

// the token's claims, for what the page offers (the server decides what it answers)
function tokenClaims(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part + "=".repeat((4 - part.length % 4) % 4)));
  } catch (e) {
    return {};
  }
}

function isOperator() {
  return Boolean(gfAuth.token) && tokenClaims(gfAuth.token).geofence_operator === true;
}

function hashParams() { return new URLSearchParams(location.hash.slice(1)); }

// #token=... of a link: taken, and out of the address bar (the rest of the hash stays)
function takeLinkToken() {
  const params = hashParams();
  const token = params.get("token");
  if (!token) return null;
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  return token;
}

function showSignIn(message) {
  const was = gfAuth.token;
  gfAuth.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  for (const el of document.querySelectorAll("[data-signed-in]")) el.hidden = true;
  document.getElementById("signin").hidden = false;
  setText("signin-error", message || "");
  const status = document.getElementById("status");
  status.textContent = "signed out";
  status.className = "status";
  for (const [name, what] of libraryNotes) libraryNote(name, what);
  if (gfAuth.onSignedOut) gfAuth.onSignedOut(was);
}

function showSignedIn() {
  document.getElementById("signin").hidden = true;
  for (const el of document.querySelectorAll("[data-signed-in]")) el.hidden = false;
}

async function signedIn(token) {
  gfAuth.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  document.getElementById("password").value = "";
  try {
    await gfAuth.onSignedIn();
  } catch (e) {
    if (e instanceof SignedOut) return;  // the form is shown again
    const status = document.getElementById("status");
    status.textContent = String(e.message || e);
    status.className = "status error";
  }
}

function startSignIn(onSignedIn, onSignedOut) {
  gfAuth.onSignedIn = onSignedIn;
  gfAuth.onSignedOut = onSignedOut || null;
  document.getElementById("signin").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let token;
    try {
      token = await signInWithPassword(document.getElementById("email").value,
                                       document.getElementById("password").value);
    } catch (e) {
      setText("signin-error", `sign-in failed: ${e.message}`);
      return;
    }
    setText("signin-error", "");
    await signedIn(token);
  });
  const out = document.getElementById("signout");
  if (out) out.addEventListener("click", () => showSignIn("signed out"));
  const token = takeLinkToken() || sessionStorage.getItem(TOKEN_KEY);
  if (token) signedIn(token);
  else showSignIn();
}

function authHeaders() {
  const h = { Authorization: `Bearer ${gfAuth.token}` };
  if (gfAuth.tenant) h["X-Geofence-Tenant"] = gfAuth.tenant;
  return h;
}

// GET a JSON route: with the token (auth) or without; a 401 shows the sign-in form again and
// throws SignedOut; another refusal throws an Error with the server's message and `status`
async function apiJSON(path, auth = true) {
  if (auth && !gfAuth.token) throw new SignedOut("not signed in");
  const r = await fetch(path, { headers: auth ? authHeaders() : {}, cache: "no-store" });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (auth && r.status === 401) {
    showSignIn("your sign-in ended: sign in again");
    throw new SignedOut("signed out");
  }
  if (!r.ok) {
    const err = new Error(body && body.error ? String(body.error) : `${path}: HTTP ${r.status}`);
    err.status = r.status;
    throw err;
  }
  return body;
}
