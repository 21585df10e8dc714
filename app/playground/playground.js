// cosyserve playground: plain browser JavaScript, no build step.
// Streams POST /v1/tts as raw 16-bit PCM and plays each piece with WebAudio as it arrives;
// other formats are fetched whole, decoded by the browser and played in an <audio> element.
"use strict";

const KEY_STORE = "cosyserve.apiKey";
const $ = (id) => document.getElementById(id);
const MIME = { wav: "audio/wav", mp3: "audio/mpeg", opus: "audio/ogg", flac: "audio/flac" };

let audioCtx = null;
let current = null; // the running synthesis: {abort, sources}
let recorded = null; // a Blob from MediaRecorder

class NeedsKey extends Error {}

function apiKey() { return localStorage.getItem(KEY_STORE) || ""; }

function withKey(headers = {}) {
  const key = apiKey();
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch (_) {
    return `${response.status} ${response.statusText}`;
  }
}

// fetch a relative API path with the stored key; a 401 opens the key panel.
async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: withKey(options.headers || {}) });
  if (response.status === 401) {
    const message = await errorMessage(response);
    askForKey(apiKey() ? `The key was refused: ${message}` : "This server needs an API key.");
    throw new NeedsKey(message);
  }
  return response;
}

function setState(state, text, cls = "muted") {
  document.body.dataset.state = state;
  const status = $("status");
  status.textContent = text;
  status.className = cls;
}

function askForKey(message) {
  $("key-message").textContent = message;
  $("key-panel").hidden = false;
  $("api-key").focus();
  setState("needs-key", "waiting for an API key", "error");
}

function option(value, label) {
  const el = document.createElement("option");
  el.value = value;
  el.textContent = label;
  return el;
}

async function loadServer(select = null) {
  const response = await api("v1/speakers");
  if (!response.ok) throw new Error(await errorMessage(response));
  const info = await response.json();
  $("model").textContent = `${info.model} · ${info.sample_rate} Hz`;
  const voice = $("voice");
  const previous = select || voice.value;
  voice.replaceChildren();
  const presets = document.createElement("optgroup");
  presets.label = "Preset speakers";
  info.speakers.forEach((s) => presets.append(option(`speaker:${s}`, s)));
  const library = document.createElement("optgroup");
  library.label = "Library voices";
  info.voices.forEach((v) => library.append(option(`voice:${v}`, v)));
  voice.append(presets, library);
  if (!info.speakers.length && !info.voices.length) voice.append(option("", "(none: register a voice)"));
  if ([...voice.options].some((o) => o.value === previous)) voice.value = previous;
  const mode = $("mode");
  const chosen = mode.value;
  mode.replaceChildren(option("", "auto"), ...info.modes.map((m) => option(m, m)));
  mode.value = info.modes.includes(chosen) ? chosen : "";
  $("key-panel").hidden = true;
  setState("idle", "ready");
}

function requestBody() {
  const body = { text: $("text").value, format: $("format").value, stream: true, priority: $("priority").value };
  const [kind, name] = $("voice").value.split(/:(.*)/s);
  if (kind === "speaker") body.speaker = name;
  if (kind === "voice") body.voice = name;
  if ($("mode").value) body.mode = $("mode").value;
  const speed = Number($("speed").value);
  if (speed && speed !== 1) body.speed = speed;
  if ($("instructions").value.trim()) body.instruct_text = $("instructions").value.trim();
  return body;
}

function showStats(s) {
  const fmt = (v, digits, unit) => (v == null ? "–" : `${v.toFixed(digits)}${unit}`);
  $("stat-ttfa").textContent = fmt(s.ttfaMs, 0, " ms");
  $("stat-rtf").textContent = fmt(s.rtf, 3, "");
  $("stat-audio").textContent = fmt(s.audioS, 2, " s");
  $("stat-samples").textContent = s.samples == null ? "–" : String(s.samples);
  $("stat-bytes").textContent = String(s.bytes || 0);
  $("stat-total").textContent = fmt(s.totalMs, 0, " ms");
  $("stat-class").textContent = s.priority || "–";
  // for scripts and tests: how many network reads brought audio, and when the first one was
  // queued for playback (pcm), measured from the click like the time to first audio
  $("stats").dataset.pieces = String(s.pieces || 0);
  $("stats").dataset.firstPlayMs = s.firstPlayMs == null ? "" : s.firstPlayMs.toFixed(1);
}

// 16-bit little-endian PCM -> one WebAudio buffer scheduled right after the previous one.
function playPcm(bytes, rate, run) {
  const n = bytes.length >> 1;
  const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
  const buffer = audioCtx.createBuffer(1, n, rate);
  const channel = buffer.getChannelData(0);
  for (let i = 0; i < n; i++) channel[i] = view.getInt16(2 * i, true) / 32768;
  const source = audioCtx.createBufferSource();
  source.buffer = buffer;
  source.connect(audioCtx.destination);
  run.next = Math.max(run.next, audioCtx.currentTime + 0.05);
  source.start(run.next);
  if (run.firstPlayMs === null) run.firstPlayMs = performance.now() - run.t0; // queued to play now
  run.next += buffer.duration;
  run.sources.push(source);
  return n;
}

async function speak() {
  if (current) return;
  audioCtx = audioCtx || new AudioContext();
  await audioCtx.resume();
  const format = $("format").value;
  const controller = new AbortController();
  const run = { abort: () => controller.abort(), sources: [], next: 0, t0: 0, firstPlayMs: null };
  current = run;
  $("speak").disabled = true;
  $("stop").disabled = false;
  $("player").hidden = true;
  $("download").hidden = true;
  const stats = { ttfaMs: null, rtf: null, audioS: null, samples: null, bytes: 0, totalMs: null, pieces: 0,
    firstPlayMs: null, priority: null };
  showStats(stats);
  setState("speaking", "synthesising…");
  const t0 = performance.now();
  run.t0 = t0;
  try {
    const response = await api("v1/tts", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(requestBody()), signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    stats.priority = response.headers.get("X-Priority") || $("priority").value; // the class the server ran it in
    const rate = Number(response.headers.get("X-Sample-Rate"));
    const reader = response.body.getReader();
    const chunks = [];
    let carry = new Uint8Array(0);
    let samples = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      if (stats.ttfaMs === null) stats.ttfaMs = performance.now() - t0;
      stats.bytes += value.length;
      stats.pieces += 1;
      if (format === "pcm") {
        const joined = new Uint8Array(carry.length + value.length);
        joined.set(carry);
        joined.set(value, carry.length);
        const usable = joined.length & ~1;
        if (usable) samples += playPcm(joined.subarray(0, usable), rate, run);
        carry = joined.slice(usable);
        stats.samples = samples;
        stats.audioS = samples / rate;
        stats.firstPlayMs = run.firstPlayMs;
      } else {
        chunks.push(value);
      }
      showStats(stats);
    }
    stats.totalMs = performance.now() - t0;
    if (format !== "pcm") {
      const blob = new Blob(chunks, { type: MIME[format] || "application/octet-stream" });
      const decoded = await audioCtx.decodeAudioData(await blob.arrayBuffer());
      stats.samples = decoded.length; // at the AudioContext's rate: the browser resamples on decode
      stats.audioS = decoded.duration;
      const url = URL.createObjectURL(blob);
      $("player").src = url;
      $("player").hidden = false;
      $("download").href = url;
      $("download").download = `speech.${format}`;
      $("download").hidden = false;
      $("player").play().catch(() => {});
    }
    stats.rtf = stats.audioS ? stats.totalMs / 1000 / stats.audioS : null;
    stats.firstPlayMs = run.firstPlayMs;
    showStats(stats);
    if (!stats.samples) throw new Error("the server sent no audio");
    setState("done", `done: ${stats.audioS.toFixed(2)} s of audio (${stats.priority})`, "ok");
  } catch (err) {
    if (controller.signal.aborted) setState("idle", "stopped");
    else if (!(err instanceof NeedsKey)) setState("error", `failed: ${err.message}`, "error");
  } finally {
    current = null;
    $("speak").disabled = false;
    $("stop").disabled = true;
  }
}

function stop() {
  if (!current) return;
  current.sources.forEach((s) => { try { s.stop(); } catch (_) { /* not started yet */ } });
  current.abort();
}

async function toggleRecord() {
  const button = $("record");
  if (button.recorder) {
    button.recorder.stop();
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (err) {
    $("record-status").textContent = `no microphone: ${err.message}`;
    return;
  }
  const recorder = new MediaRecorder(stream);
  const parts = [];
  const started = performance.now();
  recorder.ondataavailable = (e) => { if (e.data.size) parts.push(e.data); };
  recorder.onstop = () => {
    stream.getTracks().forEach((t) => t.stop());
    recorded = new Blob(parts, { type: recorder.mimeType });
    button.recorder = null;
    button.textContent = "Record";
    $("voice-file").value = "";
    const seconds = (performance.now() - started) / 1000;
    $("record-status").textContent = `recorded ${seconds.toFixed(1)} s (${recorded.size} bytes)`;
    $("record-status").dataset.recorded = "yes";
  };
  recorder.start();
  button.recorder = recorder;
  button.textContent = "Stop recording";
  $("record-status").textContent = "recording… (speak, then stop)";
}

async function registerVoice() {
  const status = $("register-status");
  const name = $("voice-name").value.trim();
  const file = $("voice-file").files[0];
  const audio = file || recorded;
  if (!audio) {
    status.textContent = "choose a file or record first";
    status.className = "error";
    return;
  }
  const form = new FormData();
  form.append("name", name);
  form.append("transcript", $("voice-transcript").value);
  const ext = (recorded && !file) ? (recorded.type.includes("ogg") ? "ogg" : "webm") : null;
  form.append("audio", audio, file ? file.name : `recording.${ext}`);
  $("register").disabled = true;
  status.textContent = "registering…";
  status.className = "muted";
  try {
    const response = await api("v1/voices", { method: "POST", body: form });
    if (response.status !== 201) throw new Error(await errorMessage(response));
    const card = await response.json();
    status.textContent = `registered “${card.name}” (${card.duration_s.toFixed(1)} s)`;
    status.className = "ok";
    await loadServer(`voice:${card.name}`);
    status.dataset.registered = card.name;  // after the voice list shows it (the browser test waits for this)
  } catch (err) {
    if (!(err instanceof NeedsKey)) {
      status.textContent = `failed: ${err.message}`;
      status.className = "error";
    }
  } finally {
    $("register").disabled = false;
  }
}

async function start() {
  try {
    await loadServer();
  } catch (err) {
    if (!(err instanceof NeedsKey)) setState("error", `cannot reach the server: ${err.message}`, "error");
  }
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const key = $("api-key").value.trim();
  if (key) localStorage.setItem(KEY_STORE, key);
  $("api-key").value = "";
  start();
});
$("forget-key").addEventListener("click", () => { localStorage.removeItem(KEY_STORE); start(); });
$("key-button").addEventListener("click", () => askForKey(apiKey() ? "Replace the stored key." : "Enter a key."));
$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", stop);
$("record").addEventListener("click", toggleRecord);
$("register").addEventListener("click", registerVoice);
$("voice-file").addEventListener("change", () => { recorded = null; $("record-status").textContent = ""; });
start();
