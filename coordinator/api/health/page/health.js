// System Health page: polls GET /api/v1/cluster every 2 s with the API key kept in this tab's
// sessionStorage, and draws each node's CPU busy, GPU busy, VRAM and GTT history as four
// separate SVG charts.
// Hand-written on purpose: no framework, no chart library, nothing from another origin.
// Text from the server is only ever set as textContent (never parsed as HTML).
"use strict";

(() => {
  const KEY_STORE = "gemmanet.apiKey";
  const POLL_MS = 2000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const CHART_W = 320;
  const CHART_H = 90;
  const $ = (id) => document.getElementById(id);

  let timer = null;
  // Node id -> its telemetry card, kept across polls so the charts do not flicker.
  const cards = new Map();

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function svgElement(tag, attributes) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    return node;
  }

  const gb = (x) => (x === null || x === undefined ? "?" : `${Number(x).toFixed(1)} GB`);
  const percent = (x) => (x === null || x === undefined ? "?" : `${Math.round(x * 100)}%`);

  // -- key handling ------------------------------------------------------------------------

  function showForm(message) {
    stopPolling();
    $("content").hidden = true;
    $("key-form").hidden = false;
    showError(message);
    $("key-input").focus();
  }

  function showError(message) {
    $("error").hidden = !message;
    $("error").textContent = message || "";
  }

  function stopPolling() {
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }

  function schedule() {
    stopPolling();
    timer = setTimeout(poll, POLL_MS);
  }

  // -- polling -----------------------------------------------------------------------------

  async function getJson(path, key) {
    const response = await fetch(path, {
      headers: { Authorization: `Bearer ${key}` },
      cache: "no-store",
    });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    return { status: response.status, ok: response.ok, body };
  }

  async function poll() {
    const key = sessionStorage.getItem(KEY_STORE);
    if (!key) {
      showForm("");
      return;
    }
    let answer;
    try {
      answer = await getJson("/api/v1/cluster", key);
    } catch (err) {
      showError(`cannot reach the coordinator (${err.message}); retrying`);
      schedule();
      return;
    }
    if (answer.status === 401) {
      sessionStorage.removeItem(KEY_STORE);
      showForm("That API key was refused; enter another.");
      return;
    }
    if (!answer.ok || answer.body === null) {
      const reason = answer.body && answer.body.error ? answer.body.error.message : "";
      showError(`the coordinator answered ${answer.status} ${reason}; retrying`);
      schedule();
      return;
    }
    showError("");
    $("key-form").hidden = true;
    $("content").hidden = false;
    try {
      await render(answer.body, key);
    } finally {
      schedule();
    }
  }

  // -- rendering ---------------------------------------------------------------------------

  // This instance's placements: how many went to a node predicted to hold the prefix.
  function affinityText(a) {
    if (!a.enabled) return "off";
    if (a.hit_rate === null) return "no placements yet";
    const rate = Math.round(a.hit_rate * 100);
    return `${rate}% hits (${a.hits} of ${a.hits + a.misses}), ${a.mean_predicted_blocks} blocks`;
  }

  // This instance's waits in the shared queue, by the priority class of the requests' keys.
  function queueWaitText(waits) {
    if (!waits.length) return "nobody waited yet";
    return waits.map((w) => `${w.priority}: ${w.mean_wait_s} s (${w.waited})`).join(", ");
  }

  async function render(cluster, key) {
    const live = cluster.instances.filter((i) => i.state === "live").length;
    $("stat-instances").textContent = `${live} / ${cluster.instances.length}`;
    $("stat-nodes").textContent = cluster.online_nodes;
    $("stat-in-flight").textContent = cluster.in_flight;
    $("stat-queue").textContent = cluster.queue_depth === null ? "unknown" : cluster.queue_depth;
    $("stat-monitor").textContent = cluster.monitor
      ? `${cluster.monitor.primary} (epoch ${cluster.monitor.epoch})`
      : "no monitor elected";
    $("stat-affinity").textContent = affinityText(cluster.affinity);
    $("stat-queue-wait").textContent = queueWaitText(cluster.queue_waits);
    const waiting = Object.entries(cluster.queued || {}).filter(([, n]) => n > 0);
    // Only an operator key gets the queue per model (it names the models); others, the total.
    $("queue-detail").textContent = waiting.length
      ? `waiting for capacity: ${waiting.map(([m, n]) => `${m} ${n}`).join(", ")}`
      : cluster.queued === null && cluster.queue_depth
        ? `${cluster.queue_depth} waiting for capacity`
        : "no request waiting for capacity";
    renderInstances(cluster.instances);
    if (cluster.nodes === null) {
      $("nodes-denied").hidden = false;
      $("nodes").hidden = true;
      $("nodes").tBodies[0].replaceChildren();
      cards.clear();
      $("telemetry").replaceChildren();
    } else {
      $("nodes-denied").hidden = true;
      $("nodes").hidden = false;
      renderNodes(cluster.nodes);
      await renderTelemetry(cluster.nodes, key);
    }
    $("refreshed").textContent = `refreshed ${new Date(cluster.generated_at * 1000).toLocaleTimeString()}`;
  }

  function renderInstances(instances) {
    const rows = instances.map((i) => {
      const row = element("tr");
      row.dataset.instanceId = i.instance_id;
      const name = element("td", "", i.instance_id + (i.answering ? " (this one)" : ""));
      row.append(
        name,
        element("td", `state-${i.state}`, i.state),
        element("td", "", `${i.last_beat_age_s.toFixed(1)} s ago`),
        element("td", "", i.nodes === null ? "–" : i.nodes),
        element("td", "", i.in_flight === null ? "–" : i.in_flight),
      );
      return row;
    });
    $("instances").tBodies[0].replaceChildren(...rows);
  }

  // Whether placement may use the node, and if not why: an agent node's own account of its
  // backend, or why a direct host's facts are not trusted. null host_state: an agent that
  // serves what it said in its hello.
  function stateCell(n) {
    const state = n.host_state === null || n.host_state === undefined ? "ok" : n.host_state;
    const cell = element("td", state === "ok" ? "host-ok" : "host-bad", state);
    cell.dataset.hostState = state;
    if (n.host_reason) {
      cell.append(element("div", "meta host-reason", n.host_reason));
    }
    return cell;
  }

  function renderNodes(nodes) {
    const rows = nodes.map((n) => {
      const row = element("tr");
      row.dataset.nodeId = n.node_id;
      const memory =
        n.memory_in_use_gb === null ? "?" : `${gb(n.memory_in_use_gb)} / ${n.vram_gb === null ? "no budget" : gb(n.vram_gb)}`;
      const rating = n.rating === null ? "none yet" : `${n.rating.toFixed(2)} (${n.ratings})`;
      row.append(
        element("td", "", n.node_id),
        element("td", "", n.instance_id),
        element("td", "", n.models.join(", ")),
        element("td", "", `${n.in_flight} / ${n.max_parallel}`),
        element("td", "", n.leases === null ? "?" : n.leases),
        element("td", "", memory),
        element("td", "", rating),
        stateCell(n),
      );
      return row;
    });
    $("nodes").tBodies[0].replaceChildren(...rows);
  }

  function card(node) {
    let entry = cards.get(node.node_id);
    if (entry) return entry;
    const root = element("div", "card");
    root.dataset.nodeId = node.node_id;
    const title = element("h3", "", node.node_id);
    const owner = element("div", "meta");
    const latest = element("div", "meta latest");
    const chart = (name, label) =>
      svgElement("svg", { class: "chart", "data-chart": name, viewBox: `0 0 ${CHART_W} ${CHART_H}`, preserveAspectRatio: "none", role: "img", "aria-label": label });
    const cpu = chart("cpu", "CPU busy");
    const gpu = chart("gpu", "GPU busy");
    const vram = chart("vram", "VRAM");
    const gtt = chart("gtt", "GTT");
    const derived = element("div", "meta derived");
    root.append(
      title, owner, latest,
      element("div", "chart-title", "CPU busy"), cpu,
      element("div", "chart-title", "GPU busy"), gpu,
      element("div", "chart-title", "VRAM (dedicated GPU memory)"), vram,
      element("div", "chart-title", "GTT (system memory mapped for the GPU)"), gtt,
      derived,
    );
    entry = { root, owner, latest, cpu, gpu, vram, gtt, derived };
    cards.set(node.node_id, entry);
    return entry;
  }

  async function samplesOf(node, key) {
    // A coordinator without telemetry has no `telemetry` field; a node that never sent a
    // sample has it null. Only then is there no history to ask for.
    if (!node.telemetry) return [];
    try {
      const answer = await getJson(`/api/v1/nodes/${encodeURIComponent(node.node_id)}/telemetry`, key);
      if (answer.ok && answer.body && Array.isArray(answer.body.samples)) return answer.body.samples;
    } catch (_) {
      // fall through: the latest sample alone
    }
    return [node.telemetry];
  }

  async function renderTelemetry(nodes, key) {
    const histories = await Promise.all(nodes.map((n) => samplesOf(n, key)));
    const seen = new Set();
    const ordered = [];
    nodes.forEach((node, index) => {
      const entry = card(node);
      seen.add(node.node_id);
      ordered.push(entry.root);
      const samples = histories[index];
      entry.owner.textContent =
        node.kind === "direct" ? "direct host (no instance owns it)" : `on instance ${node.instance_id}`;
      const last = samples.length ? samples[samples.length - 1] : null;
      entry.latest.textContent = last
        ? `CPU ${percent(last.cpu_busy)} · GPU ${percent(last.gpu_busy)} · RAM ${gb(last.memory_used_gb)} / ${gb(last.memory_total_gb)}`
        : "no samples yet";
      drawChart(entry.cpu, samples, BUSY("cpu_busy", "used-cpu"));
      drawChart(entry.gpu, samples, BUSY("gpu_busy", "used-gpu"));
      drawChart(entry.vram, samples, MEMORY("vram_used_gb", "vram_total_gb", "used-vram"));
      drawChart(entry.gtt, samples, MEMORY("gtt_used_gb", "gtt_total_gb", "used-gtt"));
      entry.derived.textContent = derivedTotal(last);
    });
    for (const id of [...cards.keys()]) if (!seen.has(id)) cards.delete(id);
    $("telemetry").replaceChildren(...ordered);
  }

  // VRAM and GTT are different memories with different costs; their sum is context only.
  function derivedTotal(sample) {
    if (!sample || sample.vram_used_gb == null || sample.gtt_used_gb == null) return "";
    const used = sample.vram_used_gb + sample.gtt_used_gb;
    const total =
      sample.vram_total_gb != null && sample.gtt_total_gb != null
        ? ` of ${gb(sample.vram_total_gb + sample.gtt_total_gb)}`
        : "";
    return `derived: VRAM + GTT in use ${gb(used)}${total}`;
  }

  // What one chart plots. Memory: used against its total (a dashed line), scaled to the
  // larger. Busy: a fraction 0..1, on a fixed scale of 0 to 100%.
  const MEMORY = (usedKey, totalKey, usedClass) => ({
    usedKey, totalKey, usedClass, top: null,
    label: (last) => `${gb(last[usedKey])} used of ${gb(last[totalKey])}`,
  });
  const BUSY = (usedKey, usedClass) => ({
    usedKey, totalKey: null, usedClass, top: 1,
    label: (last) => `${percent(last[usedKey])} busy`,
  });

  function drawChart(svg, samples, spec) {
    const { usedKey, totalKey, usedClass } = spec;
    const points = samples.filter((s) => s[usedKey] !== null && s[usedKey] !== undefined);
    svg.replaceChildren();
    svg.dataset.samples = String(points.length);
    if (!points.length) {
      const text = svgElement("text", { x: 8, y: CHART_H / 2, class: "no-samples" });
      text.textContent = "no samples yet";
      svg.append(text);
      return;
    }
    const t0 = points[0].at;
    const span = Math.max(points[points.length - 1].at - t0, 1e-9);
    const top =
      spec.top ?? Math.max(...points.map((s) => Math.max(s[usedKey], s[totalKey] ?? 0)), 1e-9);
    const x = (s) => (points.length === 1 ? CHART_W : ((s.at - t0) / span) * CHART_W).toFixed(1);
    const y = (v) => (CHART_H - 4 - (v / top) * (CHART_H - 20)).toFixed(1);
    const line = (key, className) =>
      svgElement("polyline", {
        class: className,
        points: points
          .filter((s) => s[key] !== null && s[key] !== undefined)
          .map((s) => `${x(s)},${y(s[key])}`)
          .join(" "),
      });
    if (totalKey && points.some((s) => s[totalKey] != null)) svg.append(line(totalKey, "total"));
    svg.append(line(usedKey, `used ${usedClass}`));
    const last = points[points.length - 1];
    svg.append(svgElement("circle", { cx: x(last), cy: y(last[usedKey]), r: 2.5, class: usedClass }));
    const label = svgElement("text", { x: 6, y: 12 });
    label.textContent = spec.label(last);
    svg.append(label);
  }

  // -- start -------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_STORE, key);
      $("key-input").value = "";
      poll();
    });
    $("forget-key").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_STORE);
      cards.clear();
      $("telemetry").replaceChildren();
      $("nodes").tBodies[0].replaceChildren();
      showForm("");
    });
    poll();
  });
})();
