// so101d console page: one websocket to the console process (daemon/apps/console/app.py has the protocol).
// No build step: plain DOM and canvas. window.so101dConsole exposes counters the tests read.
"use strict";

const JOINTS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"];
const PLOT_WINDOW_S = 10;
const COLORS = { leader: "#2b6cb0", command: "#dd6b20", follower: "#2f855a" };
// who drives (status.live's driver), a strip under each plot; "" (nobody: held) is left blank
const DRIVER_COLORS = { teleop: "#2b6cb0", policy: "#805ad5", correction: "#e53e3e", replay: "#d69e2e", client: "#319795" };
const DRIVER_STRIP_PX = 4;
const $ = (id) => document.getElementById(id);

const C = (window.so101dConsole = {
  statusCount: 0, liveCount: 0, previewFrames: {}, replies: 0, connected: false, link: null, lastStatus: null,
  samples: [], // {t, leader[], command[], follower[]} newest last
  arms: {}, // a rig of several arms: arm name -> {samples} (as above), one view per arm
  session: { active: false, phase: "idle", deadline: 0, task: "" },
});

let ws = null;
let nextId = 1;
const pending = new Map(); // request id -> button to re-enable
let retryMs = 500;

// ------------------------------------------------------------------ connection
function connect() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  ws = new WebSocket(`${proto}//${location.host}/ws`);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => { retryMs = 500; };
  ws.onmessage = (ev) => (typeof ev.data === "string" ? onText(JSON.parse(ev.data)) : onPreview(ev.data));
  ws.onclose = () => {
    C.connected = false;
    banner("bad", "console unreachable: reconnecting…");
    for (const btn of pending.values()) if (btn) btn.disabled = false;
    pending.clear();
    for (const id of quiet) replyHandlers.delete(id);
    quiet.clear();
    ownErrors.clear();
    replay.asked = false; replay.asking = false; // the next status asks again
    setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 4000);
  };
}

function banner(kind, text) {
  const b = $("link-banner");
  b.className = "banner " + kind;
  b.textContent = text;
}

function onText(m) {
  if (m.t === "hello" || m.t === "link") {
    showLink(m.link);
    if (m.cameras) setCameras(m.cameras);
  } else if (m.t === "live") {
    C.liveCount++;
    onLive(m.live);
  } else if (m.t === "status") {
    C.statusCount++;
    onStatus(m.status);
  } else if (m.t === "reply") {
    C.replies++;
    const btn = pending.get(m.id);
    pending.delete(m.id);
    if (btn) btn.disabled = false;
    onReply(m);
  }
}

function showLink(link) {
  C.link = link;
  C.connected = !!link.connected;
  if (link.connected) {
    banner(link.restarts ? "warn" : "good", link.restarts ? `daemon restarted (${link.restarts}×); reconnected` : "");
    if (link.restarts) setTimeout(() => C.connected && banner("good", ""), 5000);
  } else {
    banner("bad", `daemon not answering: ${link.error || "?"} (reconnecting by itself)`);
    $("mode").textContent = "no daemon";
    $("mode").className = "mode fault";
  }
}

// ------------------------------------------------------------------ verbs
function send(cmd, args, btn) {
  if (!ws || ws.readyState !== WebSocket.OPEN) { say(`${cmd}: console not connected`, true); return null; }
  const id = `p${Date.now()}-${nextId++}`;
  if (btn) { if (btn.disabled) return null; btn.disabled = true; }
  pending.set(id, btn || null);
  ws.send(JSON.stringify({ t: "verb", id, cmd, args: args || {} }));
  return id;
}

const replyHandlers = new Map(); // id -> fn(reply)
function sendThen(cmd, args, btn, fn) { const id = send(cmd, args, btn); if (id && fn) replyHandlers.set(id, fn); return id; }

// A question the page asks by itself (replay.status while a replay runs): no button, and its
// answer goes to its handler, not to the message line (an error still does, unless ownError:
// its handler shows it where it belongs).
const quiet = new Set();
const ownErrors = new Set();
function ask(cmd, fn, ownError = false) {
  if (!ws || ws.readyState !== WebSocket.OPEN) return null;
  const id = `q${Date.now()}-${nextId++}`;
  quiet.add(id);
  if (ownError) ownErrors.add(id);
  replyHandlers.set(id, fn);
  ws.send(JSON.stringify({ t: "verb", id, cmd, args: {} }));
  return id;
}

function onReply(m) {
  const fn = replyHandlers.get(m.id);
  replyHandlers.delete(m.id);
  if (quiet.delete(m.id)) {
    if (!ownErrors.delete(m.id) && !m.ok) say(`${m.cmd || "request"}: ${m.error || "failed"}`, true);
    if (fn) fn(m);
    return;
  }
  if (m.ok) say(m.message || `${m.cmd}: ok` + (m.episode !== undefined ? ` (episode ${m.episode})` : ""), false);
  else say(`${m.cmd || "request"}: ${m.error || "failed"}`, true);
  if (fn) fn(m);
}

function say(text, isError) {
  const el = $("message");
  el.textContent = text;
  el.className = "message" + (isError ? " error" : "");
}

// ------------------------------------------------------------------ live status
function fmt(v, d = 1) { return v === null || v === undefined || Number.isNaN(v) ? "–" : Number(v).toFixed(d); }

function showMode(mode, reason) {
  const el = $("mode");
  el.textContent = mode;
  el.className = "mode " + mode;
  $("reason").textContent = reason || "";
}

// The daemon's messages are read only through the fields the control API declares: each function
// or local that holds one names its type (a definition of /api/schema.json) in a JSDoc tag, and
// tests/test_api_schema.py checks every field read through it against that schema.

// 20 Hz: mode and joints (status.live); the rest comes with the 5 Hz status
/** @param {LiveStatus} lv */
function onLive(lv) {
  showMode(lv.mode, lv.reason);
  showDriver(lv.driver);
  const now = performance.now() / 1000;
  pushSample(C.samples, now, lv.joints, lv.driver);
  if (lv.arms) onLiveArms(lv.arms, now); // present only when the daemon drives more than one arm
}

function showDriver(driver) {
  C.driver = driver || ""; // (the tests read it)
  const el = $("driver");
  el.textContent = driver ? `driven by ${driver}` : "";
  el.style.color = DRIVER_COLORS[driver] || "";
}

/** @param {LiveJoints} lj */
function pushSample(samples, now, lj, driver) {
  samples.push({ t: now, leader: lj.leader, command: lj.command, follower: lj.follower, driver: driver || "" });
  while (samples.length && samples[0].t < now - PLOT_WINDOW_S) samples.shift();
}

// each arm's mode, source and joints, into its own view
/** @param {Object<string, LiveArm>} liveArms */
function onLiveArms(liveArms, now) {
  const names = Object.keys(liveArms);
  ensureArmViews(names);
  for (const name of names) {
    /** @type {LiveArm} */
    const la = liveArms[name];
    const view = armViews[name];
    pushSample(C.arms[name].samples, now, la.joints, la.driver);
    showArmMode(view, la.mode, la.reason, la.source);
  }
}

/** @param {StatusReply} st */
function onStatus(st) {
  C.lastStatus = st;
  showMode(st.mode, st.reason);
  $("follower-kind").textContent = `follower: ${st.follower_kind}`;
  $("rate").textContent = `${fmt(st.rate_hz)} / ${fmt(st.rate_hz_target, 0)} Hz`;
  /** @type {Object<string, StageTiming>} */
  const t = st.timing_ms || {};
  $("jitter").textContent = t.jitter ? `${fmt(t.jitter.p50, 2)} / ${fmt(t.jitter.p99, 2)} ms` : "–";
  $("overruns").textContent = `${st.overruns} (missed ${st.missed_cycles})`;
  $("scheduling").textContent = st.scheduling || "–";
  /** @param {LinkStatus} arm */
  const bus = (arm) => {
    if (arm && !arm.connected && arm.waiting) return arm.waiting; // which servo, which port, the next try
    return arm && arm.bus ? `${arm.bus.retries} retries, ${arm.bus.failures} errors${arm.connected ? "" : " DISCONNECTED"}` : "–";
  };
  $("bus").textContent = `${bus(st.leader)} / ${bus(st.follower)}`;
  $("stages").innerHTML = ["leader_read", "update", "follower_write", "follower_read", "hooks", "cycle"]
    .filter((k) => t[k]).map((k) => `<span class="k">${k}</span> ${fmt(t[k].p50, 2)}/${fmt(t[k].p99, 2)} ms`).join(" · ");
  showSafety(st);
  showServos(st);
  showArms(st);
  showRecording(st.recording);
  showCameraProblems(st.cameras);
  showPolicy(st.policy);
  replayFromStatus(st);
}

/** A camera that is gone (unplugged) or refused (not what was configured), named in red.
 * @param {Object<string, CameraStats>} cams */
function showCameraProblems(cams) {
  const bad = [];
  for (const name of Object.keys(cams || {}).sort()) {
    /** @type {CameraStats} */
    const stats = cams[name];
    if (stats.state === "gone" || stats.state === "refused" || stats.error)
      bad.push(`camera ${name} ${String(stats.state || "error").toUpperCase()}${stats.error ? `: ${stats.error}` : ""}`);
  }
  $("camera-problems").hidden = !bad.length;
  $("camera-problems").textContent = bad.join("\n");
}

/** @param {StatusReply} st */
function showSafety(st) {
  /** @type {SafetyStatus} */
  const safety = st.safety || {};
  const hits = Object.entries(safety.limit_hits || {}).filter(([, n]) => n > 0).map(([j, n]) => `${j} ${n}`).join(", ");
  const el = $("safety");
  el.innerHTML = `<span class="k">fault latched</span> <b>${esc(safety.fault_latched || "none")}</b> · ` +
    `<span class="k">now</span> ${esc(safety.fault_now || "none")} · <span class="k">limited cycles</span> ${safety.limited_cycles ?? "–"}` +
    (hits ? ` · <span class="k">limits hit</span> ${esc(hits)}` : "");
  el.className = "safety" + (safety.fault_latched ? " bad" : "");
}

/** @param {StatusReply} st */
function showServos(st) {
  $("servos").tBodies[0].innerHTML = servoRows(st.servos || {}, st.missing_servos || [], "");
}

/** A servo table's rows: one per servo that answers, then one per servo that does not; each
 * named `${prefix}${joint}` (a rig of several arms: LeRobot's left_shoulder_pan ...). */
function servoRows(servos, missing, prefix) {
  const rows = JOINTS.filter((j) => servos[j]).map((j) => {
    /** @type {ServoStatus} */
    const servo = servos[j];
    const temp = servo.temperature_c >= 65 ? "bad" : servo.temperature_c >= 55 ? "warn" : "";
    const volt = servo.voltage_v !== null && (servo.voltage_v < 6.0 || servo.voltage_v > 8.4) ? "bad" : servo.voltage_v < 6.5 ? "warn" : "";
    const load = Math.abs(servo.load_pct) >= 90 ? "bad" : Math.abs(servo.load_pct) >= 60 ? "warn" : "";
    const status = servo.status ? "bad" : "";
    return `<tr><td>${esc(prefix + j)}</td><td class="${temp}">${fmt(servo.temperature_c, 0)}</td><td class="${volt}">${fmt(servo.voltage_v, 1)}</td>` +
      `<td class="${load}">${fmt(servo.load_pct, 0)}</td><td class="${status}">${servo.status ? "0x" + servo.status.toString(16) : "ok"}</td></tr>`;
  });
  for (const j of missing) rows.push(`<tr><td>${esc(prefix + j)}</td><td class="bad" colspan="4">not answering</td></tr>`);
  return rows.join("");
}

// ------------------------------------------------------------------ a rig of several arms
// One view per arm (its mode and source, its servo table, its joint plots, captioned with
// LeRobot's bimanual names: left_shoulder_pan ...) in place of the single arm's table and plots.
// A single-arm daemon's status has one arm and its status.live no arms: none of this shows.
const armViews = {}; // arm name -> {mode, reason, source, servos, plots: {joint: canvas}}

function ensureArmViews(names) {
  if (names.length < 2 || names.every((n) => armViews[n])) return;
  const box = $("arms");
  for (const name of names) {
    if (armViews[name]) continue;
    const sec = document.createElement("div");
    sec.className = "arm";
    sec.id = `arm-${name}`;
    sec.innerHTML = `<h3>arm ${esc(name)} <span id="arm-${esc(name)}-mode" class="mode">…</span> ` +
      `<span id="arm-${esc(name)}-reason" class="reason"></span> <span class="k">source</span> <span id="arm-${esc(name)}-source">–</span></h3>` +
      `<table id="servos-${esc(name)}" class="servos"><thead><tr><th>servo</th><th>°C</th><th>V</th><th>load %</th><th>status</th></tr></thead><tbody></tbody></table>` +
      `<div id="plots-${esc(name)}" class="plots"></div>`;
    box.appendChild(sec);
    const view = { mode: sec.querySelector(".mode"), reason: sec.querySelector(".reason"), source: sec.querySelector(`[id$="-source"]`),
      servos: sec.querySelector("table"), plots: {} };
    const plotBox = sec.querySelector(".plots");
    for (const j of JOINTS) view.plots[j] = addPlot(plotBox, `plot-${name}-${j}`, `${name}_${j}`);
    armViews[name] = view;
    C.arms[name] = { samples: [] };
  }
  $("servos").hidden = true; // the primary arm's, shown again in its own view
  $("plots").hidden = true;
  box.hidden = false;
}

function showArmMode(view, mode, reason, source) {
  view.mode.textContent = mode;
  view.mode.className = "mode " + mode;
  view.reason.textContent = reason || "";
  view.source.textContent = source || "–";
}

/** Each arm's mode, source, servos and missing servos (5 Hz; status.live brings mode and joints at 20 Hz).
 * @param {StatusReply} st */
function showArms(st) {
  /** @type {Object<string, ArmStatus>} */
  const arms = st.arms || {};
  const names = Object.keys(arms);
  ensureArmViews(names);
  if (names.length < 2) return;
  for (const name of names) {
    /** @type {ArmStatus} */
    const armSt = arms[name];
    const view = armViews[name];
    showArmMode(view, armSt.mode, armSt.reason, armSt.source);
    view.servos.tBodies[0].innerHTML = servoRows(armSt.servos || {}, armSt.missing_servos || [], `${name}_`);
  }
}

function esc(s) { return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]); }

// ------------------------------------------------------------------ joint plots
const plotCanvases = {};
function makePlots() {
  const box = $("plots");
  for (const j of JOINTS) plotCanvases[j] = addPlot(box, `plot-${j}`, j);
}

function addPlot(box, id, caption) {
  const fig = document.createElement("figure");
  const cap = document.createElement("figcaption");
  cap.textContent = caption;
  const cv = document.createElement("canvas");
  cv.id = id;
  cv.width = 300; cv.height = 110;
  fig.append(cap, cv);
  box.appendChild(fig);
  return cv;
}

function drawSeries(ctx, w, h, xs, ys, lo, hi, color) {
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  let started = false;
  for (let i = 0; i < xs.length; i++) {
    const y = ys[i];
    if (y === null || y === undefined) { started = false; continue; }
    const px = xs[i] * w, py = h - ((y - lo) / (hi - lo)) * (h - 10) - 5;
    if (!started) { ctx.moveTo(px, py); started = true; } else ctx.lineTo(px, py);
  }
  ctx.stroke();
}

function drawDriverStrip(ctx, w, h, xs, s) {
  for (let i = 0; i < s.length; i++) {
    const color = DRIVER_COLORS[s[i].driver];
    if (!color) continue;
    // whole pixels: segments meet edge to edge, with no half-covered seam between them
    const x0 = Math.max(0, Math.floor(xs[i] * w)), x1 = i + 1 < s.length ? Math.floor(xs[i + 1] * w) : w;
    ctx.fillStyle = color;
    ctx.fillRect(x0, h - DRIVER_STRIP_PX, Math.max(1, x1 - x0), DRIVER_STRIP_PX);
  }
}

function drawPlots() {
  const now = performance.now() / 1000;
  if (!$("plots").hidden) drawPlotSet(plotCanvases, C.samples, now);
  for (const name of Object.keys(armViews)) drawPlotSet(armViews[name].plots, C.arms[name].samples, now);
}

function drawPlotSet(canvases, s, now) {
  const xs = s.map((p) => 1 - (now - p.t) / PLOT_WINDOW_S);
  JOINTS.forEach((name, k) => {
    const cv = canvases[name];
    const ctx = cv.getContext("2d");
    ctx.clearRect(0, 0, cv.width, cv.height);
    let lo = Infinity, hi = -Infinity;
    for (const p of s) for (const key of ["leader", "command", "follower"]) {
      const v = p[key] && p[key][k];
      if (v !== null && v !== undefined) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    }
    drawDriverStrip(ctx, cv.width, cv.height, xs, s);
    if (!Number.isFinite(lo)) return;
    if (hi - lo < 2) { lo -= 1; hi += 1; }
    ctx.fillStyle = "#7a8599";
    ctx.font = "10px sans-serif";
    ctx.fillText(hi.toFixed(1), 2, 10);
    ctx.fillText(lo.toFixed(1), 2, cv.height - 2);
    for (const key of ["leader", "command", "follower"]) drawSeries(ctx, cv.width, cv.height, xs, s.map((p) => p[key] && p[key][k]), lo, hi, COLORS[key]);
  });
}

// ------------------------------------------------------------------ camera previews
const camCanvases = {};
function setCameras(names) {
  const box = $("cameras");
  const have = Object.keys(camCanvases).sort().join(",");
  if (have === [...names].sort().join(",") && names.length) return;
  box.innerHTML = names.length ? "" : '<span class="dim">no camera configured</span>';
  for (const k of Object.keys(camCanvases)) delete camCanvases[k];
  for (const n of names) {
    const fig = document.createElement("figure");
    const cv = document.createElement("canvas");
    cv.id = `cam-${n}`;
    cv.width = 320; cv.height = 240;
    const cap = document.createElement("figcaption");
    cap.id = `cam-${n}-caption`;
    cap.textContent = n;
    fig.append(cv, cap);
    box.appendChild(fig);
    camCanvases[n] = { cv, cap, busy: false };
  }
}

function onPreview(buf) {
  const dv = new DataView(buf);
  const hlen = dv.getUint32(0);
  const head = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, hlen)));
  const cam = camCanvases[head.camera];
  if (!cam || cam.busy) return; // still drawing the previous one: newest wins
  cam.busy = true;
  createImageBitmap(new Blob([new Uint8Array(buf, 4 + hlen)], { type: "image/jpeg" }))
    .then((bmp) => {
      cam.cv.getContext("2d").drawImage(bmp, 0, 0, cam.cv.width, cam.cv.height);
      bmp.close();
      C.previewFrames[head.camera] = (C.previewFrames[head.camera] || 0) + 1;
      cam.cap.textContent = `${head.camera} · frame ${head.seq} · ${head.width}x${head.height} · age ${fmt(head.age_ms, 0)} ms`;
    })
    .catch((e) => say(`preview of ${head.camera}: ${e}`, true))
    .finally(() => { cam.busy = false; });
}

// ------------------------------------------------------------------ recording session
/** @param {RecordingStatus} rec */
function showRecording(rec) {
  const disabled = !rec;
  $("rec-disabled").hidden = !disabled;
  if (disabled) return;
  if (rec.error && !rec.phase) { $("rec-error").hidden = false; $("rec-error").textContent = rec.error; return; }
  $("rec-phase").textContent = rec.phase + (rec.phase === "recording" ? ` ${fmt(rec.elapsed_s)} s` : "");
  $("rec-episode").textContent = rec.episode;
  $("rec-count").textContent = `${rec.episodes_in_dataset}` + (rec.saves_pending ? ` (+${rec.saves_pending} saving)` : "") + (String(rec.last_committed || "").includes("dataset episode") ? ` · last ${rec.last_committed}` : "");
  $("rec-backlog").textContent = `${rec.writer_backlog_frames} frames, ${rec.writer_backlog_records} records`;
  $("rec-frames").textContent = rec.frames + (rec.kept ? ` (${rec.kept.frames} kept from before)` : "");
  /** @type {PrerollStatus} */
  const pre = rec.preroll;
  $("keep-box").hidden = $("preroll-line").hidden = !pre;
  if (pre) {
    $("preroll").textContent = pre.paused ? "paused while an episode records"
      : `${fmt(pre.buffered_s)} of ${fmt(pre.ring_s, 0)} s buffered (${pre.frames} frames, memory bound ${fmt(pre.bound_mb, 0)} MiB)`;
    $("keep-s").max = String(pre.ring_s);
    // the field's 30 s is more than a shorter buffer holds: start it at the whole buffer instead
    if (!C.keepSized) { C.keepSized = true; if (Number($("keep-s").value) > pre.ring_s) $("keep-s").value = String(pre.ring_s); }
    $("btn-keep").disabled = rec.phase !== "idle" || !pre.frames || pending.size > 0;
  }
  const stopped = rec.phase === "error" ? `RECORDING STOPPED: ${rec.error}` + (rec.lost_episodes && rec.lost_episodes.length ? `\nLOST: ${rec.lost_episodes.join("; ")}` : "") : "";
  const dropped = (rec.dropped_episodes || []).map((d) => `DROPPED: ${d}`).join("\n");
  const err = [stopped, dropped].filter((x) => x).join("\n");
  const saving = (rec.saving || []).map((n) => `saving… episode ${n}`).join(", ");
  if (saving) $("rec-count").textContent += ` ${saving}`;
  if (C.savingEpisode !== undefined && !(rec.saving || []).includes(C.savingEpisode)) { say(`episode ${C.savingEpisode} saved`, false); C.savingEpisode = undefined; }
  $("rec-error").hidden = !err;
  $("rec-error").textContent = err;
  const recording = rec.phase === "recording";
  $("btn-start").disabled = recording || rec.phase !== "idle" || pending.size > 0;
  for (const id of ["btn-save-success", "btn-save-failure", "btn-discard"]) $(id).disabled = !recording;
  if (!C.taskFilled && rec.task) { C.taskFilled = true; if (!$("task").value) $("task").value = rec.task; } // once: never over the operator's typing
  const s = C.session;
  if (s.active && s.phase === "episode" && !recording && !s.waiting) s.phase = "idle"; // ended elsewhere
  // a recorded replay's episode is in the dataset: the list shows it (once, when it is saved)
  if (replay.refreshAfter && rec.episodes_in_dataset > replay.listCount && !rec.saves_pending) {
    replay.refreshAfter = false;
    loadEpisodes().catch(() => {});
  }
}

function task() { return $("task").value.trim(); }
function numberField(id, fallback) { const v = Number($(id).value); return Number.isFinite(v) && v >= 0 ? v : fallback; }

function startEpisode() {
  const s = C.session;
  s.waiting = true;
  sendThen("episode.start", { task: task() }, $("btn-start"), (r) => {
    s.waiting = false;
    if (r.ok) { s.active = true; s.phase = "episode"; s.deadline = performance.now() + numberField("episode-time", 30) * 1000; }
  });
}
function endEpisode(cmd, args, btn) {
  const s = C.session;
  const was = s.phase;
  if (!sendThen(cmd, args, btn, (r) => {
    if (r.ok && r.durable === false) { C.savingEpisode = r.episode; say(`episode ${r.episode} saving… (not on the disk yet)`, false); }
    if (r.ok && s.active) { s.phase = "reset"; s.deadline = performance.now() + numberField("reset-time", 10) * 1000; }
    else if (!r.ok && s.phase === "ending") s.phase = was;
  })) return;
  if (s.phase === "episode") s.phase = "ending"; // Esc now must not discard what is being saved
}
function redo() {
  const s = C.session;
  s.waiting = true;
  sendThen("episode.redo", { task: task() }, $("btn-redo"), (r) => {
    s.waiting = false;
    if (r.ok) { s.active = true; s.phase = "episode"; s.deadline = performance.now() + numberField("episode-time", 30) * 1000; }
  });
}
function stopSession() {
  // like esc in `so101d record`: the episode this session is recording is discarded; one being
  // saved (enter, then esc at once) is not touched
  const s = C.session;
  const recording = s.active && s.phase === "episode";
  s.active = false; s.phase = "idle";
  if (recording) send("episode.discard", {}, $("btn-discard"));
}

function tickSession() {
  const s = C.session;
  const el = $("countdown");
  if (!s.active || s.waiting) { el.textContent = "–"; return; }
  const left = (s.deadline - performance.now()) / 1000;
  el.textContent = `${s.phase} ${Math.max(0, left).toFixed(1)} s`;
  if (left > 0) return;
  if (s.phase === "episode") endEpisode("episode.save", { success: true }, $("btn-save-success"));
  else if (s.phase === "reset") { s.phase = "starting"; startEpisode(); }
}

// ------------------------------------------------------------------ policy
/** @param {PolicyStatus} pol */
function showPolicy(pol) {
  const el = $("policy-status");
  if (!pol || pol.state === "none") { el.textContent = "no policy loaded"; return; }
  /** @type {LatencyStats} */
  const lat = pol.inference_latency_ms || {};
  el.textContent = `${pol.state}${pol.driving ? " DRIVING" : " standby"} · inference p50/p99 ${fmt(lat.p50)}/${fmt(lat.p99)} ms · ` +
    `chunk age ${fmt(pol.chunk_age_ms, 0)} ms · queue ${pol.queue_depth ?? "–"}` +
    (pol.takeover && pol.takeover.phase ? ` · take-over ${pol.takeover.phase}` : "") +
    (pol.correction ? ` · correction ${pol.correction.number} ${pol.correction.phase || ""}` : "") +
    (pol.warning ? ` · ${pol.warning}` : "");
  const err = pol.error || pol.last_error;
  if (err) { $("policy-error").hidden = false; $("policy-error").textContent = err; }
}

// k: the last seconds of the pre-roll buffer become an episode that records on (episode.keep)
function keepLast() {
  if ($("keep-box").hidden) { say("keep: the daemon keeps no pre-roll ([recording] ring_s = 0)", true); return; }
  const args = { last_s: Number($("keep-s").value) };
  if (task()) args.task = task();
  send("episode.keep", args, $("btn-keep"));
}

// c: the policy's correction on and off, as the pedal and `so101d policy start --keys` toggle it
// (daemon/api/input_actions.py: in a correction resume, otherwise correct; the daemon refuses
// what cannot be done, with the reason)
function correctOrResume() {
  /** @type {StatusReply} */
  const st = C.lastStatus || {};
  /** @type {PolicyStatus} */
  const pol = st.policy || {};
  if (pol.correction) send("policy.resume", {}, $("btn-policy-resume"));
  else send("policy.correct", {}, $("btn-policy-correct"));
}

// ------------------------------------------------------------------ episodes
async function loadEpisodes() {
  const r = await fetch("/api/episodes");
  if (!r.ok) { $("dataset-root").textContent = await r.text(); return; }
  const d = await r.json();
  $("dataset-root").textContent = `${d.root} · ${d.episodes.length} episodes` + (d.note ? ` · ${d.note}` : "");
  replay.listRoot = d.root;
  replay.listCount = d.episodes.length;
  const body = $("episode-list").tBodies[0];
  body.innerHTML = d.episodes.map((e) => {
    const t = e.tag || {};
    const i = e.episode_index;
    const ok = t.success === true ? "success" : t.success === false ? "failure" : "–";
    // a number, or nothing: a tag edited by hand can hold anything, and this goes into the row's HTML
    const interventions = Number(t.interventions) > 0
      ? `${fmt(t.interventions, 0)} (${fmt(t.intervention_s)} s)` : (t.interventions === 0 ? "0" : "–");
    // a replayed episode names the one it replayed (by its uid: the note's index may be stale) and how it tracked
    const of = t.origin === "replay"
      ? ` of ${e.replay_of === null ? `an episode not in this dataset (${esc(e.replay_note || "untagged")})` : `#${e.replay_of}`}` +
        (e.tracking ? `<div class="tracking">${esc(e.tracking)}</div>` : "")
      : "";
    return `<tr data-index="${i}"><td>${i}</td><td>${e.length}</td><td>${esc(e.tasks.join("; "))}</td>` +
      `<td>${ok}</td><td class="origin">${esc(t.origin || "–")}${of}</td>` +
      `<td class="interventions">${interventions}</td>` +
      `<td>${esc(t.follower_kind || "–")}</td>` +
      `<td>${esc(t.late_frames ?? "–")}/${esc(t.missing_frames ?? "–")}</td><td>${fmt(t.worst_camera_skew_ms)}</td>` +
      `<td class="replay-cell"><select id="replay-speed-${i}" title="speed: fraction of the episode's fps">` +
      `<option value="1">1×</option><option value="0.5">0.5×</option><option value="0.25">0.25×</option></select> ` +
      `<button id="btn-replay-${i}" class="btn-replay" data-index="${i}">Replay</button></td></tr>` +
      `<tr id="replay-report-${i}" class="replay-report" hidden><td colspan="10"></td></tr>`;
  }).join("");
  for (const tr of body.rows) if (tr.dataset.index !== undefined) tr.onclick = () => openEpisode(Number(tr.dataset.index), tr);
  for (const sel of body.querySelectorAll("select")) sel.onclick = (ev) => ev.stopPropagation();
  for (const btn of body.querySelectorAll(".btn-replay")) {
    btn.onclick = (ev) => {
      ev.stopPropagation(); // a click on Replay does not open the playback too
      const i = Number(btn.dataset.index);
      startReplay(i, Number($(`replay-speed-${i}`).value), btn);
    };
  }
  showReplay();
  applyReplayBlock();
  C.listLoads = (C.listLoads || 0) + 1; // (the tests wait on it)
}

// ------------------------------------------------------------------ replay
// The page names an episode and a speed; the console adds the dataset it lists and a ticket
// (its Stop sends it). The daemon's status does not carry the replay: the page asks replay.status
// while one runs (a follower driven by "replay" in status.arms starts that, whoever started it).
const REPLAY_POLL_MS = 250;
const replay = (C.replay = {
  reply: null, seenRunning: false, polling: false, asking: false, asked: false, block: "", listRoot: null, listCount: 0,
  refreshAfter: false, error: null, errorIndex: null, reports: 0, reportKey: "", refused: "",
});

function startReplay(index, speed, btn) {
  replay.error = null;
  replay.errorIndex = index;
  sendThen("replay.start", { episode: index, speed }, btn, (r) => {
    if (!r.ok) { replay.error = r.error; showReplay(); return; }
    onReplayReply(r);
  });
}
C.startReplay = startReplay;

function stopReplay(btn) { sendThen("replay.stop", {}, btn, (r) => { if (r.ok) onReplayReply(r); }); }

/** @param {ReplayReply} rr */
function onReplayReply(rr) {
  // ended, its report still being worked out (a moment): ask again
  const running = rr.phase === "aligning" || rr.phase === "playing" || (rr.phase !== "idle" && !rr.report);
  replay.reply = rr;
  replay.polling = running;
  if (running) replay.seenRunning = true;
  const key = rr.report ? JSON.stringify([rr.dataset, rr.episode, rr.message, rr.report]) : "";
  if (key && key !== replay.reportKey) {
    replay.reportKey = key;
    replay.reports++;
    // a replay seen running was recorded: its episode comes (one found ended on opening is listed already)
    if (replay.seenRunning && rr.recording !== null && rr.recording !== undefined) replay.refreshAfter = true;
    replay.seenRunning = false;
  }
  showReplay();
  applyReplayBlock();
}

function pollReplay() {
  if (!replay.polling || replay.asking) return;
  replay.asking = !!ask("replay.status", (r) => {
    replay.asking = false;
    if (r.ok) onReplayReply(r);
    else { replay.polling = false; applyReplayBlock(); } // said once; a follower still driven by "replay" asks again
  });
}

/** What keeps Replay off now (the daemon refuses these too, saying so), "" when nothing does.
 * @param {StatusReply} st */
function replayFromStatus(st) {
  /** @type {Object<string, ArmStatus>} */
  const arms = st.arms || {};
  // a daemon driving several arms refuses replay, saying why: said as what keeps Replay off, not
  // as an error of a question the operator did not ask
  const several = Object.keys(arms).length > 1;
  if (!replay.asked) {
    replay.asked = !!ask("replay.status", (r) => { // the last report
      if (r.ok) { replay.refused = ""; onReplayReply(r); }
      else if (several) { replay.refused = r.error || "refused"; applyReplayBlock(); }
    }, several);
  }
  const sources = Object.keys(arms).map((k) => arms[k].source);
  if (sources.includes("replay") && !replay.polling) replay.polling = true; // started elsewhere (so101d replay)
  const other = sources.find((x) => x && !["leader", "replay", "policy"].includes(x));
  replay.block = replay.refused ? replay.refused
    : replay.polling ? "a replay is running"
    : st.recording && st.recording.phase === "recording" ? "an episode is being recorded"
    : st.intent === "policy" || sources.includes("policy") || (st.policy && st.policy.driving) ? "a policy drives the follower"
    : other ? `the follower is driven by ${other}` : "";
  applyReplayBlock();
}

function applyReplayBlock() {
  const busy = new Set(pending.values());
  for (const btn of document.querySelectorAll(".btn-replay")) {
    btn.disabled = !!replay.block || busy.has(btn);
    btn.title = replay.block ? `replay is off: ${replay.block}` : "replay this episode on the arm (Hold or Stop stops it)";
  }
  $("replay-block").textContent = replay.block && !replay.polling ? `Replay is off: ${replay.block}` : "";
  $("btn-replay-stop").hidden = !replay.polling;
}

const sameRoot = (a, b) => !!a && !!b && a.replace(/\/+$/, "") === b.replace(/\/+$/, "");

/** The replay's line above the list, and beside its episode its progress, then its report. */
function showReplay() {
  /** @type {ReplayReply} */
  const rr = replay.reply;
  const running = replay.polling;
  const line = $("replay-state");
  if (!rr) line.textContent = "no replay yet";
  else if (running) line.textContent = `replaying episode ${rr.episode} of ${rr.dataset}: ${rr.phase}` + (rr.phase === "playing" ? ` frame ${rr.frame}/${rr.frames} at ${rr.speed}×` : "");
  else line.textContent = rr.message || rr.phase || "";
  const prog = $("replay-progress");
  prog.hidden = !running;
  if (rr && rr.frames) { prog.max = rr.frames; prog.value = rr.frame || 0; }
  for (const tr of document.querySelectorAll("#episode-list tr.replay-report")) {
    const i = Number(tr.id.replace("replay-report-", ""));
    let html = "";
    if (replay.error && replay.errorIndex === i) html = `<div class="error">replay refused: ${esc(replay.error)}</div>`;
    else if (rr && rr.phase !== "idle" && rr.episode === i && sameRoot(rr.dataset, replay.listRoot))
      html = running || !rr.report ? `<div class="dim">${esc(rr.phase)}: frame ${rr.frame ?? "–"}/${rr.frames ?? "–"}</div>` : reportHtml(rr.report, rr.recording);
    tr.hidden = !html;
    if (tr.dataset.shown !== html) { tr.dataset.shown = html; tr.cells[0].innerHTML = html; } // unchanged: left as it is
  }
}

/** @param {ReplayJointError} je */
function jointRow(je) { return `<tr><td>${esc(je.joint)}</td><td>${fmt(je.p50, 2)}</td><td>${fmt(je.p99, 2)}</td><td>${fmt(je.max, 2)}</td></tr>`; }

/** The tracking report, as `so101d replay` prints it (daemon/apps/commands/replay.py).
 * @param {ReplayReport} rep */
function reportHtml(rep, recording) {
  const head = (what) => `<thead><tr><th>${what}</th><th>p50</th><th>p99</th><th>max</th></tr></thead>`;
  const shaped = `${rep.shaped_cycles ?? "–"} cycles (step limit ${rep.step_limited_cycles ?? "–"}, joint limits ${rep.joint_limited_cycles ?? "–"})` +
    (rep.shaped_frames.length ? `; first at frames ${rep.shaped_frames.join(", ")}` : "");
  return `<div class="replay-outcome">replay ${esc(rep.outcome)}: ${rep.frames_played ?? "–"}/${rep.frames ?? "–"} frames in ${rep.cycles ?? "–"} cycles` +
    (recording !== null && recording !== undefined ? ` · recorded as episode ${recording}` : "") + `</div>` +
    `<table class="replay-error">${head("joint (commanded − measured, deg; gripper %)")}<tbody>${rep.error.map(jointRow).join("")}</tbody></table>` +
    `<div><span class="k">lag</span> <span class="replay-lag">${rep.lag_ms === null || rep.lag_ms === undefined ? "–" : `${fmt(rep.lag_ms, 0)} ms`}</span> · ` +
    `<span class="k">shaped by safety</span> <span class="replay-shaped">${shaped}</span></div>` +
    (rep.sim_gap.length ? `<table class="replay-sim-gap">${head("sim-to-real gap (recorded sim − measured real)")}<tbody>${rep.sim_gap.map(jointRow).join("")}</tbody></table>` : "");
}

const playback = { detail: null, videos: [], raf: 0, t0: 0, playing: false, cursor: 0 };
C.playback = playback;

async function openEpisode(index, tr) {
  for (const row of $("episode-list").tBodies[0].rows) row.classList.toggle("selected", row === tr);
  const r = await fetch(`/api/episodes/${index}`);
  if (!r.ok) { say(await r.text(), true); return; }
  const d = await r.json();
  playback.detail = d;
  $("playback").hidden = false;
  $("playback-index").textContent = `${index} (${d.length} frames, ${esc(d.tasks.join("; "))})`;
  $("viz-command").textContent = d.viz_command;
  const box = $("playback-videos");
  box.innerHTML = "";
  playback.videos = [];
  for (const [name, v] of Object.entries(d.videos)) {
    const fig = document.createElement("figure");
    const vid = document.createElement("video");
    vid.id = `playback-${name}`;
    vid.muted = true; vid.preload = "auto"; vid.src = v.url;
    vid.addEventListener("loadedmetadata", () => { vid.currentTime = v.from_s; });
    const cap = document.createElement("figcaption");
    cap.textContent = name;
    fig.append(vid, cap);
    box.appendChild(fig);
    playback.videos.push({ vid, from_s: v.from_s, to_s: v.to_s });
  }
  playback.cursor = 0;
  drawPlayback();
}

function playEpisode() {
  const d = playback.detail;
  if (!d) return;
  playback.playing = true;
  for (const v of playback.videos) { v.vid.currentTime = v.from_s; v.vid.play().catch((e) => say(`video: ${e}`, true)); }
  playback.t0 = performance.now();
  const dur = d.length / d.fps;
  const step = () => {
    // the first video is the clock; the plot cursor follows it (videos and joints stay in sync)
    const v = playback.videos[0];
    const t = v ? v.vid.currentTime - v.from_s : (performance.now() - playback.t0) / 1000;
    playback.cursor = Math.min(dur, Math.max(0, t));
    for (const w of playback.videos) if (w.vid.currentTime >= w.to_s) w.vid.pause();
    drawPlayback();
    if (playback.cursor < dur - 1 / d.fps && playback.playing && !(v && v.vid.paused)) playback.raf = requestAnimationFrame(step);
    else playback.playing = false;
  };
  playback.raf = requestAnimationFrame(step);
}

function drawPlayback() {
  const d = playback.detail;
  const cv = $("playback-plot");
  const ctx = cv.getContext("2d");
  ctx.clearRect(0, 0, cv.width, cv.height);
  if (!d || !d.state.length) return;
  const n = d.state.length;
  const rowH = cv.height / 2;
  // top: observation.state (measured), bottom: action (sent); one colour per joint
  const palette = ["#2b6cb0", "#dd6b20", "#2f855a", "#805ad5", "#c53030", "#718096"];
  [["state", 0], ["action", 1]].forEach(([key, row]) => {
    const rows = d[key];
    let lo = Infinity, hi = -Infinity;
    for (const r of rows) for (const v of r) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    if (hi - lo < 1) hi = lo + 1;
    ctx.fillStyle = "#5a6477"; ctx.font = "10px sans-serif";
    ctx.fillText(key === "state" ? "observation.state" : "action", 4, row * rowH + 10);
    for (let j = 0; j < rows[0].length; j++) {
      ctx.strokeStyle = palette[j % palette.length];
      ctx.beginPath();
      rows.forEach((r, i) => {
        const x = (i / Math.max(1, n - 1)) * cv.width;
        const y = row * rowH + rowH - ((r[j] - lo) / (hi - lo)) * (rowH - 14) - 2;
        if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      });
      ctx.stroke();
    }
  });
  const x = (playback.cursor / (n / d.fps)) * cv.width;
  ctx.strokeStyle = "#000";
  ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, cv.height); ctx.stroke();
}

// ------------------------------------------------------------------ wiring
function wire() {
  $("btn-hold").onclick = (e) => send("hold", {}, e.currentTarget);
  $("btn-torque-off").onclick = (e) => send("torque.off", {}, e.currentTarget);
  $("btn-resume").onclick = (e) => send("teleop.start", {}, e.currentTarget);
  $("btn-start").onclick = () => startEpisode();
  $("btn-save-success").onclick = (e) => endEpisode("episode.save", { success: true }, e.currentTarget);
  $("btn-save-failure").onclick = (e) => endEpisode("episode.save", { success: false }, e.currentTarget);
  $("btn-discard").onclick = (e) => endEpisode("episode.discard", {}, e.currentTarget);
  $("btn-redo").onclick = () => redo();
  $("btn-stop-session").onclick = () => stopSession();
  $("btn-policy-load").onclick = (e) => {
    $("policy-error").hidden = true;
    sendThen("policy.load", { path: $("policy-path").value, wait_s: 60 }, e.currentTarget, (r) => {
      if (!r.ok) { $("policy-error").hidden = false; $("policy-error").textContent = r.error; }
    });
  };
  $("btn-policy-start").onclick = (e) => send("policy.start", task() ? { task: task() } : {}, e.currentTarget);
  $("btn-policy-stop").onclick = (e) => send("policy.stop", {}, e.currentTarget);
  $("btn-policy-takeover").onclick = (e) => send("policy.takeover", {}, e.currentTarget);
  $("btn-keep").onclick = () => keepLast();
  $("btn-policy-correct").onclick = (e) => send("policy.correct", {}, e.currentTarget);
  $("btn-policy-resume").onclick = (e) => send("policy.resume", {}, e.currentTarget);
  $("btn-episodes-refresh").onclick = () => loadEpisodes();
  $("btn-replay-stop").onclick = (e) => stopReplay(e.currentTarget);
  $("btn-play").onclick = () => playEpisode();
  document.addEventListener("keydown", (e) => {
    if (e.target instanceof HTMLInputElement) return; // typing the task
    // Ctrl+C (copy), Ctrl+K, a browser's own shortcuts, a key held down: none of them is an order
    if (e.ctrlKey || e.metaKey || e.altKey || e.repeat) return;
    const k = e.key;
    if (k === " ") { e.preventDefault(); startEpisode(); }
    else if (k === "Enter" || k === "ArrowRight") endEpisode("episode.save", { success: true }, $("btn-save-success"));
    else if (k === "f" || k === "F") endEpisode("episode.save", { success: false }, $("btn-save-failure"));
    else if (k === "Backspace") { e.preventDefault(); redo(); }
    else if (k === "d") endEpisode("episode.discard", {}, $("btn-discard"));
    else if (k === "Escape") stopSession();
    else if (k === "h") send("hold", {}, $("btn-hold"));
    else if (k === "c") correctOrResume();
    else if (k === "k") keepLast();
  });
}

makePlots();
wire();
connect();
loadEpisodes().catch(() => {});
setInterval(drawPlots, 50);
setInterval(tickSession, 100);
setInterval(pollReplay, REPLAY_POLL_MS);
