// /venues/{id}: a hive's owner page. Signs in (common.js: Firebase Auth's REST API, the Auth
// emulator on the local stack; or #token=... from a link), then draws the
// owner's routes: the public card (live occupancy, both sources, the usual figure), the
// analytics (today by hour, forecast against what happened, popular times, days) and the
// sensors' health. Refreshes every 30 s; uPlot (npm, /vendor/uplot) for the charts.
"use strict";

const REFRESH_MS = 30000;
const DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const hiveId = decodeURIComponent(location.pathname.split("/").pop());
const charts = {};
// uPlot missing (its script a 404: no `npm ci` on the server): a message in place of the charts,
// the figures and tables still shown
const noCharts = libraryMissing("uPlot", "uPlot", "/vendor/uplot/uPlot.iife.min.js",
                                ["chart-today", "chart-forecast"], "charts");

function chart(id, opts, data) {
  if (noCharts) return;
  const el = document.getElementById(id);
  if (charts[id]) charts[id].destroy();
  charts[id] = new uPlot({ width: Math.max(300, el.clientWidth), height: 220, ...opts }, data, el);
}

async function get(path, auth = true) {
  return apiJSON(path, auth);
}

function drawNow(card, analytics) {
  setText("title", `${card.name} · ${card.type}`);
  const occ = card.occupancy;
  setText("occupancy", occ ? String(occ.occupancy) + (card.capacity ? ` / ${card.capacity}` : "") : "–");
  setText("phones", occ && occ.app_occupancy !== null ? String(occ.app_occupancy) : "–");
  const usual = card.usual;
  const el = document.getElementById("usual");
  el.textContent = usual ? fmt(usual.occupancy) : "–";
  setText("usual-k", usual && usual.busyness ? `usual at this hour: ${usual.busyness}` : "usual at this hour");
  el.className = "v" + (usual && usual.busyness === "busier than usual" ? " busy-more"
    : usual && usual.busyness === "less busy than usual" ? " busy-less" : "");
  setText("today-counts", occ ? `${occ.entries} / ${occ.exits}` : "–");
}

function drawToday(today) {
  if (noCharts) return;
  const hours = today.hours;
  const xs = hours.map((_, i) => i);
  const left = uPlot.paths.bars({ size: [0.3, 30], align: -1 });  // entries left of the hour's tick
  const right = uPlot.paths.bars({ size: [0.3, 30], align: 1 });  // exits right of it
  chart("chart-today", {
    scales: { x: { time: false } },
    axes: [{ incrs: [1, 2, 3, 4, 6], values: (u, ticks) => ticks.map((i) => (hours[i] ? `${hours[i].hour}h` : "")) },
           { size: 50 }],
    series: [{}, { label: "mean inside", stroke: "#1f5fbf", width: 2 },
             { label: "entries", stroke: "#1a7f37", fill: "rgba(26,127,55,.35)", paths: left },
             { label: "exits", stroke: "#c2410c", fill: "rgba(194,65,12,.35)", paths: right }],
  }, [xs, hours.map((h) => h.mean_occupancy), hours.map((h) => h.entries), hours.map((h) => h.exits)]);
}

function drawForecast(forecast) {
  const days = [...new Set(forecast.map((f) => f.day))].sort();
  const past = [...days].reverse().find((d) => forecast.some((f) => f.day === d && f.actual !== null));
  const next = days[days.length - 1];
  const hours = Array.from({ length: 24 }, (_, h) => h);
  const pick = (day, key) => hours.map((h) => {
    const f = forecast.find((x) => x.day === day && x.hour === h);
    return f ? f[key] : null;
  });
  chart("chart-forecast", {
    scales: { x: { time: false } },
    axes: [{ incrs: [1, 2, 3, 4, 6], values: (u, ticks) => ticks.map((h) => `${h}h`) }, { size: 50 }],
    series: [{}, { label: `forecast ${past || "-"}`, stroke: "#7c3aed", width: 2, dash: [6, 4] },
             { label: `actual ${past || "-"}`, stroke: "#1f5fbf", width: 2 },
             { label: `forecast ${next || "-"}`, stroke: "#c2410c", width: 2 }],
  }, [hours, pick(past, "occupancy"), pick(past, "actual"), pick(next, "occupancy")]);
  setText("forecast-note", past ? `the forecast of ${past} against what happened, and of ${next}`
    : "no forecast yet: the nightly analytics makes them");
}

function drawHeatmap(profile) {
  const head = document.querySelector("#heatmap thead");
  const body = document.querySelector("#heatmap tbody");
  head.replaceChildren();
  body.replaceChildren();
  if (!profile) {
    const td = body.insertRow().insertCell();
    td.className = "empty";
    td.textContent = "no profile yet: the nightly analytics makes it";
    return;
  }
  const hr = head.insertRow();
  hr.appendChild(document.createElement("th"));
  for (let h = 0; h < 24; h++) { const th = document.createElement("th"); th.textContent = h; hr.appendChild(th); }
  const all = profile.weekdays.flat().filter((v) => v !== null);
  const top = Math.max(1e-9, ...all);
  profile.weekdays.forEach((row, w) => {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = `${DAYS[w]} (${profile.samples[w]})`;
    tr.appendChild(th);
    row.forEach((v) => {
      const td = tr.insertCell();
      const a = v === null ? 0 : v / top;
      td.style.background = v === null ? "#eef0f4" : `rgba(31,95,191,${(0.08 + 0.92 * a).toFixed(3)})`;
      td.title = v === null ? "no data" : fmt(v);
      if (v !== null && a > 0.6) td.textContent = Math.round(v);
    });
  });
}

function drawSensors(sensors) {
  fill("sensors", sensors, (s) => [
    [s.id], [s.last_report_at ? new Date(s.last_report_at * 1000).toLocaleString() : "never"],
    [s.silent ? "silent" : "reporting", s.silent ? "down" : "up"],
    [s.battery_mv === null ? "–" : `${s.battery_mv} mV`, s.low_battery ? "n down" : "n"],
    [fmt(s.gprs_signal, 0), "n"],
    [s.config ? `#${s.config.configuration_id} ${s.config.state}` : "–"],
    [s.alerts.length ? s.alerts.join("; ") : "none", s.alerts.length ? "down" : ""],
  ], "no sensor installed");
}

function drawDays(analytics) {
  const peak = (day, key) => {
    const hs = analytics.hourly[day] || [];
    const v = hs.map((h) => h[key]).filter((x) => x !== null);
    return v.length ? Math.max(...v) : null;
  };
  fill("days", [...analytics.days].reverse(), (d) => [
    [d.day], [String(d.entries), "n"], [String(d.exits), "n"], [String(d.residual), "n"],
    [d.correction === "none" ? "none" : `${d.correction} x${fmt(d.factor, 3)}`],
    [fmt(peak(d.day, "peak_occupancy")), "n"], [fmt(peak(d.day, "phones_peak"), 0), "n"],
  ], "no day computed yet: the nightly analytics computes the closed days");
}

async function refresh() {
  try {
    const [card, analytics, sensors] = await Promise.all([
      get(`/hives/${encodeURIComponent(hiveId)}`, false),
      get(`/owner/hives/${encodeURIComponent(hiveId)}/analytics?days=14`),
      get(`/owner/hives/${encodeURIComponent(hiveId)}/sensors`),
    ]);
    if (!gfAuth.token) return;  // signed out meanwhile
    showSignedIn();
    drawNow(card, analytics);
    drawToday(analytics.today);
    drawForecast(analytics.forecast);
    drawHeatmap(analytics.profile);
    drawSensors(sensors.sensors);
    drawDays(analytics);
    setText("status", `updated ${new Date().toLocaleTimeString()} · business day ${analytics.today.day}`);
    document.getElementById("status").classList.remove("error");
    if (noCharts) libraryNote("uPlot", "charts");
  } catch (e) {
    if (e instanceof SignedOut || !gfAuth.token) return;
    setText("status", `no figures: ${e.message}`);
    document.getElementById("status").classList.add("error");
  }
}

startSignIn(refresh);
setInterval(() => { if (gfAuth.token) refresh(); }, REFRESH_MS);
