// perfbalance node view: polls /api/state and draws the CPU heatmap, decisions and containers.
// No framework, no CDN; every string from the cluster is inserted with textContent (never HTML).
"use strict";

const POLL_MS = 2000;
const COLUMNS_PER_ROW = 16;
const CLASS_COLORS = ["#c8e6c9", "#bbdefb", "#ffe0b2", "#e1bee7", "#b2dfdb", "#f8bbd0", "#d7ccc8", "#fff9c4"];
const classColor = new Map([["default", "#eceff1"]]);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "style") Object.assign(e.style, v); else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

function fmt(v, digits = 2) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }
function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(0) + " %"; }
function bytesRate(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s"];
  let i = 0; while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return v.toFixed(v >= 100 || i === 0 ? 0 : 1) + " " + units[i];
}
function ago(t) {
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 90) return s.toFixed(0) + " s ago";
  if (s < 5400) return (s / 60).toFixed(0) + " min ago";
  return s < 172800 ? (s / 3600).toFixed(0) + " h ago" : "at " + new Date(t * 1000).toISOString().slice(0, 19).replace("T", " ");
}
function clock(t) { return new Date(t * 1000).toLocaleTimeString([], {hour12: false}); }

// White -> hue ramp; text turns white on dark cells so every value stays readable.
function heat(frac, hue) {
  const f = Math.max(0, Math.min(1, frac || 0));
  return {background: `hsl(${hue}, 75%, ${97 - 52 * f}%)`, color: f > 0.6 ? "#fff" : "#1b1f24"};
}
function colorOf(name) {
  if (!classColor.has(name)) classColor.set(name, CLASS_COLORS[(classColor.size - 1) % CLASS_COLORS.length]);
  return classColor.get(name);
}

function rows(cpus) {
  const maxBw = Math.max(1, ...cpus.map(c => c.bandwidth));
  return [
    ["avx512", "AVX-512", c => ({text: pct(c.avx512), style: heat(c.avx512 / 0.5, 0), heavy: c.heavy})],
    ["mpki", "LLC MPKI", c => ({text: fmt(c.mpki, 1), style: heat(Math.log1p(c.mpki) / Math.log1p(30), 275)})],
    ["bandwidth", "mem BW", c => ({text: bytesRate(c.bandwidth), style: heat(c.bandwidth / maxBw, 210)})],
    ["class", "RDT class", c => ({text: c.classes.join(", ") || "–", style: {background: c.classes.length === 1 ? colorOf(c.classes[0]) : "#fff3e0", color: "#1b1f24"}})],
  ];
}

function drawHeatmap(cpus) {
  const box = document.getElementById("heatmap");
  box.replaceChildren();
  if (!cpus.length) { box.append(el("p", {class: "empty"}, "no CPUs in the report")); return; }
  // Siblings side by side: order by NUMA node, physical core, then CPU id.
  const ordered = [...cpus].sort((a, b) => a.node - b.node || a.core - b.core || a.id - b.id);
  const spec = rows(ordered);
  for (let start = 0; start < ordered.length; start += COLUMNS_PER_ROW) {
    const chunk = ordered.slice(start, start + COLUMNS_PER_ROW);
    const head = el("tr", {}, el("th", {}, "CPU"), ...chunk.map(c => el("th", {title: `core ${c.core}, NUMA ${c.node}, L3 ${c.l3}`}, c.id)));
    const core = el("tr", {}, el("th", {}, "core"), ...chunk.map(c => el("th", {}, `${c.node}:${c.core}`)));
    const body = spec.map(([key, label, f]) => el("tr", {}, el("th", {}, label), ...chunk.map(c => {
      const v = f(c);
      return el("td", {class: "cell" + (v.heavy ? " heavy" : ""), "data-cpu": c.id, "data-metric": key, style: v.style,
                      title: `CPU ${c.id} · ${label}: ${v.text}\n${c.containers.join("\n")}`}, v.text);
    })));
    const who = el("tr", {}, el("th", {}, "containers"), ...chunk.map(c =>
      el("td", {class: "who", "data-cpu": c.id}, ...c.containers.map(n => el("span", {}, n.split("/").pop())))));
    box.append(el("table", {}, el("thead", {}, head, core), el("tbody", {}, ...body, who)));
  }
  const legend = document.getElementById("legend");
  legend.replaceChildren(
    el("span", {}, el("i", {style: heat(1, 0)}), "AVX-512 active ratio (red outline: core shared with an AVX-512-heavy container)"),
    el("span", {}, el("i", {style: heat(1, 275)}), "LLC misses / 1000 instructions"),
    el("span", {}, el("i", {style: heat(1, 210)}), "memory bandwidth (relative)"),
    ...[...classColor.entries()].map(([n, c]) => el("span", {}, el("i", {style: {background: c}}), `class ${n}`)));
}

function drawDecisions(decisions) {
  const tbody = document.querySelector("#decisions tbody");
  tbody.replaceChildren();
  if (!decisions.length) { tbody.append(el("tr", {}, el("td", {colspan: 9, class: "empty"}, "no moves yet"))); return; }
  for (const d of decisions) {
    const r = d.realized;
    const realized = r ? fmt(r.gain, 3) + (r.rolled_back ? " (rolled back)" : "") : "pending";
    const status = !d.ok ? el("span", {class: "status-bad"}, "failed: " + d.error) : r && r.rolled_back ? el("span", {class: "status-bad"}, "rolled back") : el("span", {class: "status-ok"}, "applied");
    tbody.append(el("tr", {"data-event": d.event_id},
      el("td", {class: "nowrap"}, clock(d.time)), el("td", {}, d.kind), el("td", {class: "nowrap"}, d.name),
      el("td", {class: "nowrap"}, `${d.from} → ${d.to}`), el("td", {class: "reason"}, d.reason),
      el("td", {class: "num"}, fmt(d.predicted_benefit, 3)), el("td", {class: "num"}, fmt(d.predicted_cost, 3)),
      el("td", {class: "num"}, realized), el("td", {class: "nowrap"}, status)));
  }
}

function drawContainers(containers) {
  const tbody = document.querySelector("#containers tbody");
  tbody.replaceChildren();
  for (const c of [...containers].sort((a, b) => a.name.localeCompare(b.name))) {
    tbody.append(el("tr", {class: c.heavy ? "heavy" : "", "data-container": c.id},
      el("td", {}, c.name), el("td", {}, c.cpuset || "all"), el("td", {}, c["class"]), el("td", {}, c.qos),
      el("td", {class: "num"}, fmt(c.cpu)), el("td", {class: "num"}, pct(c.avx512)), el("td", {class: "num"}, pct(c.evex256)),
      el("td", {class: "num"}, fmt(c.ipc)), el("td", {class: "num"}, fmt(c.mpki, 1)), el("td", {class: "num"}, bytesRate(c.bandwidth)),
      el("td", {class: "num"}, pct(c.contamination))));
  }
}

function drawDomains(domains) {
  const box = document.getElementById("domains");
  box.replaceChildren();
  for (const d of domains) {
    const frac = d.peak > 0 ? d.bandwidth / d.peak : null;
    const label = `NUMA ${d.domain}: ${bytesRate(d.bandwidth)}` + (frac === null ? " (peak unknown)" : ` = ${pct(frac)} of ${bytesRate(d.peak)}`);
    box.append(el("div", {class: "bar", "data-domain": d.domain},
      el("div", {style: {width: `${Math.min(100, 100 * (frac || 0))}%`, background: frac > 0.9 ? "#ef9a9a" : "#90caf9"}}), el("span", {}, label)));
  }
}

function chip(text, cls) { return el("span", {class: "chip " + (cls || "")}, text); }

function drawStatus(s) {
  document.getElementById("node").textContent = s.node;
  const v = s.view, chips = [];
  chips.push(chip(s.ready ? "ready" : "starting", s.ready ? "ok" : "bad"));
  if (s.report) chips.push(chip(`cycle ${v.cycle} · ${ago(v.time)}`));
  chips.push(chip(s.config.valid ? "config valid" : "config invalid: " + s.config.error, s.config.valid ? "ok" : "bad"));
  for (const [name, c] of Object.entries(v.collectors || {})) chips.push(chip(`${name} ${c.up ? "up" : "down"}`, c.up ? "ok" : "bad"));
  if (s.mqtt && s.mqtt.configured) chips.push(chip(s.mqtt.connected ? "MQTT connected" : "MQTT disconnected", s.mqtt.connected ? "ok" : "bad"));
  chips.push(chip(`${s.counters.moves_total} moves · ${s.counters.rollbacks_total} rollbacks`));
  document.getElementById("status").replaceChildren(...chips);
}

async function refresh() {
  const err = document.getElementById("error");
  try {
    const res = await fetch("api/state", {cache: "no-store"});
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const s = await res.json();
    drawStatus(s);
    drawHeatmap(s.view.cpus);
    drawDecisions(s.view.decisions);
    drawContainers(s.view.containers);
    drawDomains(s.view.domains);
    err.hidden = true;
    document.body.dataset.cycle = s.report ? s.view.cycle : "";
  } catch (e) {
    err.textContent = "cannot load /api/state: " + e.message;
    err.hidden = false;
  }
}

refresh();
setInterval(refresh, POLL_MS);
