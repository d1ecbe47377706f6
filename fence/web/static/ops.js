// /ops: a platform operator signs in (common.js), then the page polls /ops/data (the figures
// fence/ops.py asks Prometheus for; an operator's only) every few seconds and draws them. uPlot
// (npm, served from /vendor/uplot) for the two charts.
"use strict";

const POLL_MS = 5000;
const TABLES = ["processes", "queues", "dead-letters", "alerts"];
const charts = {};
let timer = null;
// uPlot missing (its script a 404: no `npm ci` on the server): a message in place of the charts,
// the figures and tables still shown
const noCharts = libraryMissing("uPlot", "uPlot", "/vendor/uplot/uPlot.iife.min.js",
                                ["chart-rates", "chart-latency"], "charts");

function ms(x) {
  return x === null || x === undefined ? "–" : `${fmt(x, 1)} ms`;
}

function chart(id, series, data) {
  if (noCharts) return;
  const el = document.getElementById(id);
  const width = Math.max(300, el.clientWidth);
  if (!charts[id]) {
    charts[id] = new uPlot({
      width, height: 220, series: [{}, ...series],
      axes: [{}, { size: 60 }], scales: { x: { time: true } },
    }, data, el);
  } else {
    charts[id].setData(data);
  }
}

function render(d) {
  const last = (xs) => { for (let i = xs.length - 1; i >= 0; i--) if (xs[i] !== null) return xs[i]; return null; };
  document.getElementById("updates").textContent = fmt(last(d.series.updates_per_s));
  document.getElementById("events").textContent = fmt(last(d.series.events_per_s));
  document.getElementById("p50").textContent = ms(d.latency_ms.p50);
  document.getElementById("p99").textContent = ms(d.latency_ms.p99);
  chart("chart-rates", [
    { label: "updates/s", stroke: "#1f5fbf", width: 2 },
    { label: "events/s", stroke: "#c2410c", width: 2 },
  ], [d.series.t, d.series.updates_per_s, d.series.events_per_s]);
  chart("chart-latency", [{ label: "p99 ms", stroke: "#7c3aed", width: 2 }], [d.series.t, d.series.p99_ms]);
  fill("processes", d.processes, (p) => [
    [p.name], [p.state || (p.up ? "up" : "DOWN"), p.up ? "up" : "down"], [fmt(p.received_per_s), "n"],
    [fmt(p.positions), "n"], [fmt(p.events), "n"], [fmt(p.objects, 0), "n"], [fmt(p.fences, 0), "n"],
    [fmt(p.held, 0), "n"],
  ], "no process scraped yet");
  fill("queues", d.queues, (q) => [[q.vhost], [q.queue], [fmt(q.ready, 0), "n"], [fmt(q.unacked, 0), "n"]],
       "no queue metrics (rabbitmq_prometheus)");
  fill("dead-letters", d.dead_letters, (x) => [[x.role], [x.reason], [fmt(x.total, 0), "n"],
       [fmt(x.last_15m, 0), "n"]], "none");
  fill("webhooks", d.webhooks || [], (w) => [[w.endpoint], [w.tenant],
       [w.enabled ? "enabled" : "disabled", w.enabled ? "" : "firing"], [fmt(w.delivered_per_s, 1), "n"],
       [fmt(w.failed_per_s, 2), "n"], [fmt(w.backlog, 0), "n"], [fmt(w.oldest_s, 1), "n"],
       [fmt(w.lag_p99_ms, 0), "n"], [fmt(w.dead, 0), "n"]], "no webhook endpoint");
  fill("alerts", d.alerts, (a) => [[a.name], [a.state, a.state], [a.summary]], "none firing");
  const up = d.processes.filter((p) => p.up).length;
  document.getElementById("status").textContent =
    `${up}/${d.processes.length} processes up · updated ${new Date(d.at * 1000).toLocaleTimeString()}`;
  if (noCharts) libraryNote("uPlot", "charts");
}

async function poll() {
  clearTimeout(timer);
  timer = null;
  const status = document.getElementById("status");
  try {
    const body = await apiJSON("/ops/data");
    if (!gfAuth.token) return;  // signed out meanwhile
    showSignedIn();
    status.classList.remove("error");
    render(body);
  } catch (e) {
    if (e instanceof SignedOut || !gfAuth.token) return;  // the form is shown
    if (e.status === 403) {  // signed in, not an operator: the server says so, the form again
      showSignIn(e.message);
      return;
    }
    showSignedIn();
    status.textContent = `no figures: ${e.message}`;
    status.classList.add("error");
  }
  timer = setTimeout(poll, POLL_MS);
}

// signed out: nothing of the figures stays in the page
function forget() {
  clearTimeout(timer);
  timer = null;
  for (const id of Object.keys(charts)) { charts[id].destroy(); delete charts[id]; }
  for (const id of TABLES) document.querySelector(`#${id} tbody`).replaceChildren();
  for (const id of ["updates", "events", "p50", "p99"]) setText(id, "–");
}

startSignIn(poll, forget);
