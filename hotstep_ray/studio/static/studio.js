// The studio page: make an adapter from a folder (one job, its stages live, then the timeline and
// an A/B), datasets with a songs grid whose fields can be fixed by hand, jobs with live progress,
// a loss chart, audition players with a waveform under each side.
// Plain DOM, no framework and nothing fetched from outside this server. Every API call sends
// the bearer token typed into the page (kept in this tab's sessionStorage, never in a URL);
// job events are read as Server-Sent Events through fetch() so the token stays in a header.
// Text from the server only ever reaches the page through textContent, never as markup.
"use strict";

const API = "/api/training";
const TOKEN_KEY = "hotstep-token";
const JOBS_POLL_MS = 2000;
const LOG_LINES_KEPT = 400;
const LOSS_METRICS = ["step", "epoch"]; // per-step points when there are any, else per epoch
// The make job's stages in order (`main_job.STAGES`); a stage not listed here is added as seen.
const MAKE_STAGES = ["dataset", "label", "build", "checkpoints", "preprocess", "train-dit", "train-lm", "audition", "report"];
// The song fields the edit dialog writes (the PATCH body's keys) and their inputs.
const SONG_FIELDS = { caption: "song-caption", lyrics: "song-lyrics", bpm: "song-bpm", key: "song-key", signature: "song-signature", language: "song-language" };

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  datasets: [],
  detail: null, // the selected dataset (detail JSON)
  jobs: [],
  jobId: "", // the job shown in the job view
  stream: null, // AbortController of the job's event stream
  audioUrls: [], // blob: URLs to revoke when the players are replaced
  make: { jobId: "", stream: null, audioUrls: [], followed: false },
  songs: [], // the selected dataset's songs grid
  song: null, // the song open in the edit dialog (its fields as loaded)
};

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("data-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children) node.append(child);
  return node;
}

function headers(extra = {}) {
  const out = { ...extra };
  if (state.token) out.Authorization = `Bearer ${state.token}`;
  return out;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, { method = "GET", body } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  const text = await response.text();
  if (!response.ok) throw failure(response, text);
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return { error: text };
  }
}

// The server's `{"error": ...}` line of a failed response, as an ApiError to throw.
function failure(response, text) {
  if (response.status === 401) needToken();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: text };
  }
  return new ApiError(response.status, (data && data.error) || `HTTP ${response.status}`);
}

function notify(message, kind = "error") {
  const box = $("notice");
  box.textContent = message;
  box.className = `notice ${kind}`;
  box.hidden = !message;
}

function needToken() {
  notify("This server needs a bearer token: type it in the Token field above.");
  $("token").focus();
}

function pill(node, status) {
  node.textContent = status;
  node.className = `pill ${status}`;
}

function seconds(value) {
  if (!value) return "";
  const m = Math.floor(value / 60);
  const s = Math.round(value % 60);
  return m ? `${m}:${String(s).padStart(2, "0")}` : `${s} s`;
}

// -- health + token --------------------------------------------------------------------------
async function checkHealth() {
  try {
    // health answers without a token and says whether ours is right
    const health = await api("/api/health");
    if (!health.authorized) needToken();
    pill($("health"), health.authorized ? "ok" : "down");
    $("health").textContent = health.authorized ? "connected" : "token needed";
    return Boolean(health.authorized);
  } catch (error) {
    pill($("health"), "down");
    $("health").textContent = error.status === 401 ? "token needed" : "unreachable";
    return false;
  }
}

$("token-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  state.token = $("token").value.trim();
  if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
  else sessionStorage.removeItem(TOKEN_KEY);
  $("token").value = "";
  notify("");
  if (await checkHealth()) await refreshAll();
});

// -- datasets --------------------------------------------------------------------------------
async function refreshDatasets() {
  const { datasets } = await api(`${API}/datasets`);
  state.datasets = datasets;
  const body = $("datasets").tBodies[0];
  body.replaceChildren(
    ...datasets.map((d) => {
      const row = el(
        "tr",
        { class: "clickable", "data-slug": d.slug, title: d.sourceDir },
        el("td", { text: d.name }),
        el("td", { text: String(d.sampleCount) }),
        el("td", { text: String(d.labeledCount) }),
        el("td", {}, el("span", { class: `pill ${d.status}`, text: d.status })),
      );
      if (state.detail && state.detail.slug === d.slug) row.classList.add("selected");
      row.addEventListener("click", () => showDataset(d.slug));
      return row;
    }),
  );
  $("datasets-empty").hidden = datasets.length > 0;
}

$("create-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = { sourceDir: $("create-source").value.trim() };
  const name = $("create-name").value.trim();
  const tag = $("create-tag").value.trim();
  if (name) body.name = name;
  if (tag) body.customTag = tag;
  try {
    const { dataset } = await api(`${API}/datasets`, { method: "POST", body });
    $("create-form").reset();
    notify(`Created ${dataset.name} (${dataset.samples.length} songs).`, "info");
    await refreshDatasets();
    await showDataset(dataset.slug);
  } catch (error) {
    notify(`Could not create the dataset: ${error.message}`);
  }
});

async function showDataset(slug) {
  const detail = await api(`${API}/datasets/${encodeURIComponent(slug)}`);
  state.detail = detail;
  $("detail-panel").hidden = false;
  $("detail-title").textContent = detail.name;
  const facts = [
    ["Slug", detail.slug],
    ["Source", detail.sourceDir],
    ["Trigger", detail.customTag || "(none)"],
    ["Songs", `${detail.sampleCount} (${detail.labeledCount} labeled, ${detail.excludedCount} excluded)`],
    ["Status", detail.status],
    ["Tensor caches", (detail.preprocessedVariants || []).join(", ") || "(none)"],
  ];
  $("detail-facts").replaceChildren(
    ...facts.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", { text: value })]),
  );
  $("detail-warnings").replaceChildren(
    ...(detail.warnings || []).map((w) => el("li", { text: w })),
  );
  await refreshSongs();
  for (const row of $("datasets").tBodies[0].rows) {
    row.classList.toggle("selected", row.dataset.slug === slug);
  }
  await refreshPreviews();
}

// -- the songs grid and the edit dialog ------------------------------------------------------
async function refreshSongs() {
  if (!state.detail) return;
  const { songs } = await api(`${API}/datasets/${encodeURIComponent(state.detail.slug)}/songs`);
  state.songs = songs;
  $("samples").tBodies[0].replaceChildren(...songs.map(songRow));
}

function songRow(song) {
  const label = song.excluded ? "excluded" : song.fileMissing ? "missing" : song.labelStatus;
  const row = el(
    "tr",
    { class: "clickable", "data-sample": song.sampleId, title: song.file },
    el("td", { text: song.file }),
    el("td", { text: seconds(song.duration) }),
    el("td", { text: song.bpm ? String(song.bpm) : "" }),
    el("td", { text: song.key || "" }),
    el("td", { text: song.caption || "", title: song.caption || "" }),
    el("td", { text: song.lyricsExcerpt || "", title: song.lyricsExcerpt || "" }),
    el("td", { text: song.error ? "error" : label, title: song.error || "", class: song.error ? "label-error" : "" }),
  );
  row.addEventListener("click", () => openSong(song.sampleId));
  return row;
}

function songUrl(sampleId) {
  return `${API}/datasets/${encodeURIComponent(state.detail.slug)}/songs/${encodeURIComponent(sampleId)}`;
}

async function openSong(sampleId) {
  if (!state.detail) return;
  try {
    const { song } = await api(songUrl(sampleId)); // in full: the grid holds an excerpt of the lyrics
    state.song = song;
    $("song-title").textContent = song.file.split("/").pop();
    const facts = [song.file, seconds(song.duration), song.excluded ? "excluded" : song.labelStatus, song.error];
    $("song-file").textContent = facts.filter(Boolean).join(" · ");
    for (const [field, id] of Object.entries(SONG_FIELDS)) {
      $(id).value = song[field] === null || song[field] === undefined ? "" : String(song[field]);
    }
    showSongError("");
    $("song-dialog").dataset.sample = sampleId;
    if (!$("song-dialog").open) $("song-dialog").showModal();
  } catch (error) {
    notify(`Could not open the song: ${error.message}`);
  }
}

function showSongError(message) {
  $("song-error").textContent = message;
  $("song-error").hidden = !message;
}

// Only the fields the user changed are sent: a field left alone is never rewritten.
function songChanges() {
  const changes = {};
  for (const [field, id] of Object.entries(SONG_FIELDS)) {
    const before = state.song[field] === null || state.song[field] === undefined ? "" : String(state.song[field]);
    const now = $(id).value;
    if (now === before) continue;
    // bpm goes as typed: the server parses it and answers a readable 422 for "fast" or 2000
    if (field === "bpm") changes.bpm = now.trim() === "" ? null : now.trim();
    else changes[field] = now;
  }
  return changes;
}

$("song-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!state.song || !state.detail) return;
  const changes = songChanges();
  if (!Object.keys(changes).length) {
    $("song-dialog").close();
    return;
  }
  $("song-save").disabled = true;
  try {
    const { song } = await api(songUrl(state.song.sampleId), { method: "PATCH", body: changes });
    const index = state.songs.findIndex((s) => s.sampleId === song.sampleId);
    if (index >= 0) {
      state.songs[index] = song;
      const old = $("samples").querySelector(`tr[data-sample="${CSS.escape(song.sampleId)}"]`);
      if (old) old.replaceWith(songRow(song));
    }
    state.song = null;
    $("song-dialog").close();
    notify(`Saved ${song.file}: its sidecar is updated (the original is kept as .bak).`, "info");
    $("song-dialog").dataset.saved = song.sampleId;
  } catch (error) {
    showSongError(error.message); // 422 names the field: the dialog stays open to fix it
  } finally {
    $("song-save").disabled = false;
  }
});

$("song-cancel").addEventListener("click", () => {
  state.song = null;
  $("song-dialog").close();
});

// -- make an adapter (one job: main_job's stages, then the timeline and the A/B) -----------
$("make-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = {
    songsDir: $("make-songs").value.trim(),
    trainOnRay: $("make-ray").checked,
    audition: $("make-audition").checked,
  };
  const name = $("make-name").value.trim();
  const tag = $("make-tag").value.trim();
  const epochs = $("make-epochs").value.trim();
  if (name) body.name = name;
  if (tag) body.tag = tag;
  if (epochs) body.epochs = Number(epochs);
  $("make-start").disabled = true;
  try {
    const answer = await api(`${API}/make`, { method: "POST", body });
    notify(`Making an adapter from ${answer.dataset.name} (job ${answer.jobId}).`, "info");
    followMake(answer.jobId);
    await refreshDatasets().catch(() => {});
    await refreshJobs().catch(() => {});
    await showDataset(answer.dataset.slug).catch(() => {}); // its songs, while the job runs
  } catch (error) {
    notify(`Could not start: ${error.message}`);
  } finally {
    $("make-start").disabled = false;
  }
});

function followMake(jobId) {
  const make = state.make;
  if (make.stream) make.stream.abort();
  make.jobId = jobId;
  make.followed = true;
  const view = { id: jobId, status: "queued", stage: "", phase: "", done: 0, total: 0, seen: [], failedStage: "" };
  $("make-view").hidden = false;
  $("make-result").hidden = true;
  $("make-ab").hidden = true;
  $("make-error").hidden = true;
  renderMake(view);
  const controller = new AbortController();
  make.stream = controller;
  readEvents(jobId, controller.signal, (event) => onMakeEvent(view, event)).catch((error) => {
    if (error.name !== "AbortError") notify(`make: event stream: ${error.message}`);
  });
}

function onMakeEvent(view, event) {
  if (state.make.jobId !== view.id) return;
  switch (event.type) {
    case "job":
      view.status = event.job.status;
      view.datasetId = event.job.datasetId;
      break;
    case "progress":
      if (event.stage) {
        // labels are written by now: the songs grid shows them
        if (event.stage === "build" && state.detail && state.detail.id === view.datasetId) {
          refreshSongs().catch(() => {});
        }
        view.stage = event.stage;
        if (!view.seen.includes(event.stage)) view.seen.push(event.stage);
        view.phase = "";
      } else if (event.phase) {
        view.phase = event.phase; // a stage's own step (probe, essentia, train, ...)
      }
      Object.assign(view, { done: event.done, total: event.total });
      break;
    case "status":
      view.status = event.status;
      if (event.status !== "done") view.failedStage = view.stage;
      if (event.error) {
        $("make-error").textContent = event.error;
        $("make-error").hidden = false;
      }
      showMakeResult(view);
      break;
    default:
      return;
  }
  renderMake(view);
}

function renderMake(view) {
  pill($("make-status"), view.status);
  const running = !["done", "failed", "cancelled"].includes(view.status);
  $("make-stage").textContent = running && view.stage ? `Stage: ${view.stage}` : "";
  $("make-phase").textContent = running && view.phase ? view.phase : "";
  const names = [...MAKE_STAGES, ...view.seen.filter((n) => !MAKE_STAGES.includes(n))];
  $("make-stages").replaceChildren(
    ...names.map((name) => {
      let cls = "";
      if (name === view.failedStage) cls = "failed";
      else if (name === view.stage && running) cls = "current";
      else if (view.seen.includes(name)) cls = "done";
      return el("li", { class: cls, "data-stage": name, text: name });
    }),
  );
  const bar = $("make-progress");
  bar.max = view.total || 1;
  bar.value = view.total ? view.done : view.status === "done" ? 1 : 0;
  bar.hidden = !running && view.status !== "done";
}

async function showMakeResult(view) {
  await refreshJobs().catch(() => {});
  await refreshDatasets().catch(() => {});
  await refreshAdapters().catch(() => {});
  if (view.status !== "done" || state.make.jobId !== view.id) return;
  let result;
  try {
    result = await api(`${API}/jobs/${encodeURIComponent(view.id)}/result`);
  } catch (error) {
    notify(`make: result: ${error.message}`);
    return;
  }
  for (const li of $("make-stages").children) {
    const row = result.stages.find((r) => r.name === li.dataset.stage);
    if (row && row.summary.startsWith("skipped")) li.className = "skipped";
  }
  $("make-timeline").tBodies[0].replaceChildren(
    ...result.stages.map((row) =>
      el(
        "tr",
        { "data-stage": row.name, title: row.artifact || "" },
        el("td", { text: row.name }),
        el("td", { text: `${row.seconds.toFixed(1)} s` }),
        el("td", { text: row.summary }),
        el("td", { text: row.loss || "" }),
      ),
    ),
  );
  const adapters = [
    ["DiT adapter", result.dit],
    ["LM adapter", result.lm],
  ].filter(([, run]) => run);
  $("make-adapters").replaceChildren(
    ...adapters.flatMap(([name, run]) => [el("dt", { text: name }), el("dd", { text: run.url, title: run.adapter_id })]),
  );
  $("make-result").hidden = false;
  if (result.ab && result.ab.preview_id) showMakeAb(result.ab);
  if (state.detail && result.dataset && state.detail.id === result.dataset.id) {
    await showDataset(state.detail.slug).catch(() => {});
  }
}

function showMakeAb(ab) {
  for (const url of state.make.audioUrls.splice(0)) URL.revokeObjectURL(url);
  $("make-ab-caption").textContent = `“${ab.caption}” · seed ${ab.seed} · the same seed on both sides`;
  const group = waveGroup();
  for (const side of document.querySelectorAll("#make-ab .ab-side")) {
    const slot = side.dataset.slot;
    const player = el("audio", { controls: true, preload: "none", "data-slot": slot });
    const wave = waveCanvas(player, slot, group);
    side.replaceChildren(side.querySelector("figcaption"), player, wave);
    loadAudio(player, `${API}/previews/${encodeURIComponent(ab.preview_id)}/${slot}`, state.make.audioUrls, wave);
  }
  $("make-ab").hidden = false;
}

// -- starting jobs ---------------------------------------------------------------------------
for (const button of document.querySelectorAll(".buttons button")) {
  button.addEventListener("click", () => startJob(button.dataset.kind));
}

async function startJob(kind) {
  if (!state.detail) return;
  let options;
  try {
    options = JSON.parse($("job-options").value || "{}");
  } catch (error) {
    notify(`Options are not valid JSON: ${error.message}`);
    return;
  }
  try {
    const url = `${API}/datasets/${encodeURIComponent(state.detail.slug)}/${kind}`;
    const answer = await api(url, { method: "POST", body: options });
    if (!answer.jobId) {
      notify(`Nothing to do (${answer.skipped || "skipped"}).`, "info");
      return;
    }
    notify(`Started ${kind} (job ${answer.jobId}).`, "info");
    await refreshJobs();
    selectJob(answer.jobId);
  } catch (error) {
    notify(`${kind}: ${error.message}`);
  }
}

// -- jobs ------------------------------------------------------------------------------------
function datasetName(id) {
  const found = state.datasets.find((d) => d.id === id);
  return found ? found.name : id;
}

function progressText(job) {
  if (!job.total) return job.phase || "";
  return `${job.done} / ${job.total}${job.phase ? ` ${job.phase}` : ""}`;
}

async function refreshJobs() {
  const { jobs } = await api(`${API}/jobs`);
  state.jobs = jobs;
  $("jobs").tBodies[0].replaceChildren(
    ...jobs.map((job) => {
      const finished = job.status === "done" ? 1 : 0; // a stage without counters: full when done
      const bar = el("progress", { max: job.total || 1, value: job.total ? job.done : finished });
      const row = el(
        "tr",
        { class: "clickable", "data-job": job.id, "data-status": job.status },
        el("td", { text: job.kind }),
        el("td", { text: datasetName(job.datasetId) }),
        el("td", {}, el("span", { class: `pill ${job.status}`, text: job.status })),
        el("td", {}, bar, el("div", { class: "muted", text: progressText(job) })),
      );
      if (job.id === state.jobId) row.classList.add("selected");
      row.addEventListener("click", () => {
        selectJob(job.id);
        if (job.kind === "make" && job.id !== state.make.jobId) followMake(job.id);
      });
      return row;
    }),
  );
  $("jobs-empty").hidden = jobs.length > 0;
  if (!state.make.followed) {
    // A reloaded page picks up the newest make job: its progress, or its timeline and A/B.
    const make = jobs.find((job) => job.kind === "make");
    if (make) followMake(make.id);
  }
}

function selectJob(jobId) {
  if (state.stream) state.stream.abort();
  state.jobId = jobId;
  for (const row of $("jobs").tBodies[0].rows) {
    row.classList.toggle("selected", row.dataset.job === jobId);
  }
  const view = {
    job: state.jobs.find((j) => j.id === jobId) || { id: jobId, kind: "", status: "queued" },
    loss: {}, // metric kind -> [[step, loss], ...]
    ended: false,
  };
  $("job-view").hidden = false;
  $("job-log").replaceChildren();
  $("job-players").replaceChildren();
  $("loss-figure").hidden = true;
  $("loss-chart").replaceChildren();
  renderJob(view);
  const controller = new AbortController();
  state.stream = controller;
  readEvents(jobId, controller.signal, (event) => onEvent(view, event))
    .catch((error) => {
      if (error.name !== "AbortError") log(`event stream: ${error.message}`, "error");
    })
    .finally(() => {
      if (state.jobId === jobId && !controller.signal.aborted) refreshJobs().catch(() => {});
    });
}

// SSE over fetch: `data: <json>` frames separated by blank lines (the server's framing).
async function readEvents(jobId, signal, onFrame) {
  const response = await fetch(`${API}/jobs/${encodeURIComponent(jobId)}/events`, {
    headers: headers({ Accept: "text/event-stream" }),
    signal,
  });
  if (!response.ok) throw new ApiError(response.status, `HTTP ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (data) onFrame(JSON.parse(data));
    }
  }
}

function onEvent(view, event) {
  switch (event.type) {
    case "job":
      view.job = event.job;
      break;
    case "progress":
      Object.assign(view.job, { done: event.done, total: event.total, failed: event.failed });
      if (event.phase) view.job.phase = event.phase;
      break;
    case "log":
      log(event.message, event.level);
      break;
    case "sample":
      if (event.status === "failed") log(`${event.sampleId}: ${event.error}`, "error");
      break;
    case "metric":
      if (LOSS_METRICS.includes(event.metric) && typeof event.loss === "number") {
        const points = (view.loss[event.metric] ||= []);
        points.push([event.step ?? points.length + 1, event.loss]);
        drawLoss(view);
      }
      break;
    case "status":
      view.job.status = event.status;
      view.job.error = event.error;
      view.ended = true;
      if (event.error) log(event.error, "error");
      onJobEnd(view);
      break;
    default:
      break;
  }
  renderJob(view);
}

function renderJob(view) {
  const job = view.job;
  $("job-title").textContent = `${job.kind || "job"} ${job.id}`;
  pill($("job-status"), job.status);
  $("job-phase").textContent = job.phase ? `phase: ${job.phase}` : "";
  const bar = $("job-progress");
  bar.max = job.total || 1;
  bar.value = job.total ? job.done : job.status === "done" ? 1 : 0;
  $("job-progress-text").textContent = progressText(job);
  $("job-cancel").disabled = view.ended || ["done", "failed", "cancelled"].includes(job.status);
}

function log(message, level = "info") {
  const list = $("job-log");
  list.append(el("li", { class: level, text: message }));
  while (list.childElementCount > LOG_LINES_KEPT) list.firstElementChild.remove();
  list.scrollTop = list.scrollHeight;
}

$("job-cancel").addEventListener("click", async () => {
  if (!state.jobId) return;
  try {
    await api(`${API}/jobs/${encodeURIComponent(state.jobId)}/cancel`, { method: "POST" });
  } catch (error) {
    notify(`cancel: ${error.message}`);
  }
});

async function onJobEnd(view) {
  await refreshJobs().catch(() => {});
  await refreshAdapters().catch(() => {});
  if (state.detail && view.job.datasetId === state.detail.id) {
    await showDataset(state.detail.slug).catch(() => {});
  }
  await refreshDatasets().catch(() => {});
  if (view.job.kind === "audition" && view.job.status === "done" && state.jobId === view.job.id) {
    try {
      const preview = await api(`${API}/jobs/${encodeURIComponent(view.job.id)}/result`);
      $("job-players").replaceChildren(previewBox(preview));
    } catch (error) {
      log(`result: ${error.message}`, "error");
    }
  }
}

// -- loss chart (SVG) ------------------------------------------------------------------------
const CHART = { width: 480, height: 200, left: 44, right: 10, top: 10, bottom: 26 };

function svg(tag, attrs = {}, text = "") {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text) node.textContent = text;
  return node;
}

function drawLoss(view) {
  const kind = LOSS_METRICS.find((k) => (view.loss[k] || []).length);
  if (!kind) return;
  const points = view.loss[kind];
  const chart = $("loss-chart");
  const { width, height, left, right, top, bottom } = CHART;
  const xs = points.map((p) => p[0]);
  const ys = points.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y1 - y0 < 1e-9) [y0, y1] = [y0 - 0.5, y1 + 0.5];
  const sx = (x) => left + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (width - left - right);
  const sy = (y) => top + (1 - (y - y0) / (y1 - y0)) * (height - top - bottom);
  const nodes = [];
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    nodes.push(svg("line", { class: "grid", x1: left, x2: width - right, y1: sy(y), y2: sy(y) }));
    nodes.push(svg("text", { x: left - 4, y: sy(y) + 3, "text-anchor": "end" }, y.toPrecision(3)));
  }
  nodes.push(svg("line", { class: "axis", x1: left, x2: left, y1: top, y2: height - bottom }));
  nodes.push(
    svg("line", { class: "axis", x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }),
  );
  nodes.push(svg("text", { x: left, y: height - 8 }, String(x0)));
  nodes.push(svg("text", { x: width - right, y: height - 8, "text-anchor": "end" }, String(x1)));
  nodes.push(svg("text", { x: (width + left) / 2, y: height - 8, "text-anchor": "middle" }, kind === "step" ? "optimizer step" : "epoch end (step)"));
  const path = points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
  nodes.push(svg("polyline", { class: "line", points: path }));
  for (const [x, y] of points) {
    const dot = svg("circle", { class: "point", cx: sx(x).toFixed(1), cy: sy(y).toFixed(1), r: 2.5 });
    dot.append(svg("title", {}, `step ${x}: loss ${y.toFixed(4)}`));
    nodes.push(dot);
  }
  chart.replaceChildren(...nodes);
  chart.dataset.points = String(points.length);
  chart.dataset.metric = kind;
  const last = points[points.length - 1];
  $("loss-caption").textContent = `loss per ${kind}: ${points.length} points, last ${last[1].toFixed(4)} at step ${last[0]}`;
  $("loss-figure").hidden = false;
}

// -- previews (audio players) ----------------------------------------------------------------
async function refreshPreviews() {
  if (!state.detail) return;
  const { previews } = await api(`${API}/previews?datasetId=${encodeURIComponent(state.detail.id)}`);
  for (const url of state.audioUrls.splice(0)) URL.revokeObjectURL(url);
  $("previews").replaceChildren(...previews.map(previewBox));
  $("previews-empty").hidden = previews.length > 0;
}

function previewBox(preview) {
  const when = new Date(preview.createdAt).toLocaleString();
  const box = el(
    "div",
    { class: "preview", "data-preview": preview.previewId },
    el("div", { class: "caption", text: `${when} · seed ${preview.seed} · ${preview.caption}` }),
  );
  const group = waveGroup();
  for (const side of preview.sides) {
    const row = el("div", { class: "side" }, el("span", { text: side.slot }));
    if (side.ok && side.audioUrl) {
      const player = el("audio", { controls: true, preload: "none", "data-slot": side.slot });
      const wave = waveCanvas(player, side.slot, group);
      row.append(el("div", { class: "player" }, player, wave));
      loadAudio(player, side.audioUrl, state.audioUrls, wave);
    } else {
      row.append(el("em", { class: "muted", text: side.error || "failed" }));
    }
    box.append(row);
  }
  return box;
}

// <audio src> cannot send a header: fetch the bytes with the token and play a blob URL; the
// same bytes, decoded, draw the side's waveform (`wave`, a canvas from waveCanvas) when given.
async function loadAudio(player, url, urls = state.audioUrls, wave = null) {
  let blob;
  try {
    const response = await fetch(url, { headers: headers() });
    if (!response.ok) throw new ApiError(response.status, `HTTP ${response.status}`);
    blob = await response.blob();
    const blobUrl = URL.createObjectURL(blob);
    urls.push(blobUrl);
    player.src = blobUrl;
    player.dataset.loaded = "1";
  } catch (error) {
    player.replaceWith(el("em", { class: "muted", text: `audio: ${error.message}` }));
    if (wave) wave.remove();
    return;
  }
  if (wave) await decodeWave(wave, blob);
}

// -- waveforms (a canvas under each A/B player) ----------------------------------------------
// Each side is decoded once to WAVE_COLUMNS min/max pairs of its mono mix; the canvas redraws
// them at its own pixel width (on resize too). The sides of one A/B share a group, drawn on the
// group's loudest peak, so a quieter side looks quieter. A click on the picture seeks there.
const WAVE_COLUMNS = 1200;
const WAVE_SAMPLE_RATE = 44100; // decodeAudioData resamples to the context's rate
const waveResizes = new ResizeObserver((entries) => entries.forEach((entry) => drawWave(entry.target)));

function waveGroup() {
  return { peak: 0, waves: [] };
}

function waveCanvas(player, slot, group) {
  const wave = el("canvas", { class: "wave", hidden: true, "data-slot": slot });
  wave.setAttribute("role", "img");
  wave.setAttribute("aria-label", `waveform of the ${slot} side`);
  wave.view = { player, group, peaks: null };
  group.waves.push(wave);
  for (const name of ["timeupdate", "seeked", "ended"]) player.addEventListener(name, () => drawWave(wave));
  wave.addEventListener("click", (event) => {
    if (player.duration > 0) player.currentTime = (event.offsetX / wave.clientWidth) * player.duration;
  });
  return wave;
}

// Decoding that fails (a format this browser cannot read) leaves the player alone, no picture.
async function decodeWave(wave, blob) {
  let audio;
  try {
    const context = new OfflineAudioContext(1, 1, WAVE_SAMPLE_RATE); // decodes, never plays
    audio = await context.decodeAudioData(await blob.arrayBuffer());
  } catch {
    wave.remove();
    return;
  }
  const { view } = wave;
  view.peaks = peaksOf(audio, WAVE_COLUMNS);
  view.group.peak = Math.max(view.group.peak, view.peaks.peak);
  const loudness = view.peaks.peak > 0 ? `peak ${(20 * Math.log10(view.peaks.peak)).toFixed(1)} dBFS` : "silent";
  wave.setAttribute("aria-label", `waveform of the ${wave.dataset.slot} side, ${loudness}`);
  wave.title = `${loudness} (mono mix); click to play from there`;
  wave.hidden = false;
  waveResizes.observe(wave);
  for (const other of view.group.waves) drawWave(other); // the group's scale may have grown
}

// min/max of the channels' mean over `columns` equal spans of the buffer: [columns] each.
function peaksOf(audio, columns) {
  const channels = Array.from({ length: audio.numberOfChannels }, (_, c) => audio.getChannelData(c));
  const count = Math.max(1, Math.min(columns, audio.length));
  const min = new Float32Array(count);
  const max = new Float32Array(count);
  let peak = 0;
  for (let column = 0; column < count; column++) {
    const from = Math.floor((column * audio.length) / count);
    const to = Math.floor(((column + 1) * audio.length) / count);
    let low = 0;
    let high = 0;
    for (let i = from; i < to; i++) {
      let sum = 0;
      for (const data of channels) sum += data[i];
      const value = sum / channels.length;
      if (value < low) low = value;
      else if (value > high) high = value;
    }
    min[column] = low;
    max[column] = high;
    peak = Math.max(peak, high, -low);
  }
  return { min, max, peak };
}

function drawWave(wave) {
  const { peaks, group, player } = wave.view;
  if (!wave.isConnected) waveResizes.unobserve(wave); // its players were replaced
  if (!peaks || !wave.isConnected) return;
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(1, Math.round(wave.clientWidth * ratio)); // device px
  const height = Math.max(1, Math.round(wave.clientHeight * ratio));
  if (wave.width !== width) wave.width = width;
  if (wave.height !== height) wave.height = height;
  const pen = wave.getContext("2d");
  pen.clearRect(0, 0, width, height);
  const style = getComputedStyle(wave);
  pen.fillStyle = style.color;
  const middle = height / 2;
  const scale = middle / (group.peak || 1); // device px per unit of amplitude
  const n = peaks.min.length;
  for (let x = 0; x < width; x++) {
    // the peak columns under this pixel (at least one: the canvas may be wider than WAVE_COLUMNS)
    const from = Math.min(n - 1, Math.floor((x * n) / width));
    const to = Math.max(from + 1, Math.floor(((x + 1) * n) / width));
    let low = 0;
    let high = 0;
    for (let i = from; i < to; i++) {
      low = Math.min(low, peaks.min[i]);
      high = Math.max(high, peaks.max[i]);
    }
    const top = middle - high * scale;
    pen.fillRect(x, top, 1, Math.max(ratio, (high - low) * scale)); // silence: a thin centre line
  }
  wave.dataset.drawn = String(width);
  if (player.duration > 0 && player.currentTime > 0) {
    pen.fillStyle = style.getPropertyValue("--ink").trim() || "#000";
    pen.fillRect(Math.round((player.currentTime / player.duration) * (width - ratio)), 0, ratio, height);
  }
}

// -- adapters --------------------------------------------------------------------------------
// Every trained run (`GET /adapters`, as `hotstep-ray adapters list`): the adapter, its base
// model, format, size, trigger, when it was trained, the run's state, its ΔW/W verdict (amber
// when a group may overpower the base), its calibration, and Download / Delete.
async function refreshAdapters() {
  const { adapters } = await api(`${API}/adapters`);
  $("adapters").tBodies[0].replaceChildren(
    ...adapters.map((a) => {
      const trigger = a.trigger && a.trigger.word ? a.trigger.word : "–";
      const size = !a.sizeBytes
        ? "–"
        : a.sizeBytes < 1e6
          ? `${(a.sizeBytes / 1e3).toFixed(1)} kB`
          : `${(a.sizeBytes / 1e6).toFixed(1)} MB`;
      const state = a.status || "unknown";
      const flagged = (a.deltaFlagged || []).length > 0;
      return el(
        "tr",
        { "data-id": a.id },
        el("td", { text: a.id }),
        el("td", { text: `${a.kind.toUpperCase()} ${a.base || "?"}` }),
        el("td", { text: a.format }),
        el("td", { text: size }),
        el("td", { text: trigger }),
        el("td", { text: a.trainedAt ? a.trainedAt.replace("T", " ") : "–" }),
        el("td", { class: "state" }, el("span", { class: `pill ${state}`, text: a.statusDetail || state })),
        el("td", { class: flagged ? "delta flagged" : "delta", text: a.deltaVerdict || "–" }),
        el("td", { class: "calibration", text: a.calibration || "–" }),
        adapterActions(a),
      );
    }),
  );
  $("adapters-empty").hidden = adapters.length > 0;
}

// Download (only what has weights: a run without its export has nothing to load) and Delete
// (not while the run trains: the trainer would write the folder again; the server refuses too).
function adapterActions(a) {
  const url = `${API}/adapters/${a.id.split("/").map(encodeURIComponent).join("/")}`;
  const cell = el("td", { class: "adapter-actions" });
  if (a.weights) {
    const link = el("a", { href: `${url}/download`, class: "adapter-download", text: "Download" });
    link.addEventListener("click", (event) => {
      event.preventDefault();
      downloadAdapter(a, link);
    });
    cell.append(link);
  }
  const training = a.status === "training";
  const remove = el("button", {
    type: "button",
    class: "adapter-delete",
    text: "Delete",
    disabled: training,
    title: training ? "Still training: cancel its job first" : `Delete ${a.id}`,
  });
  remove.addEventListener("click", () => deleteAdapter(a, url));
  cell.append(remove);
  return cell;
}

// A plain link cannot send the token: fetch the zip with it and hand the browser a blob URL,
// named as the server's Content-Disposition says.
async function downloadAdapter(a, link) {
  link.setAttribute("aria-busy", "true");
  try {
    const response = await fetch(link.href, { headers: headers() });
    if (!response.ok) throw failure(response, await response.text());
    const named = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") || "");
    const blobUrl = URL.createObjectURL(await response.blob());
    const save = el("a", { href: blobUrl, download: named ? named[1] : `${a.id.replaceAll("/", "-")}.zip` });
    document.body.append(save);
    save.click();
    save.remove();
    setTimeout(() => URL.revokeObjectURL(blobUrl), 60000); // revoked at once, some browsers drop the download
  } catch (error) {
    notify(`Could not download ${a.id}: ${error.message}`);
  } finally {
    link.removeAttribute("aria-busy");
  }
}

async function deleteAdapter(a, url) {
  const removed = "Its folder (and Ray Train's folder of the run, if it trained on Ray) is removed from storage";
  if (!confirm(`Delete the adapter ${a.id}?\n\n${removed}; this cannot be undone.`)) return;
  try {
    await api(url, { method: "DELETE" });
    notify(`Deleted ${a.id}.`, "info");
  } catch (error) {
    notify(`Could not delete ${a.id}: ${error.message}`);
  }
  await refreshAdapters().catch(() => {}); // after a refusal too: the run's state has moved on
}

// -- start -----------------------------------------------------------------------------------
async function refreshAll() {
  await refreshDatasets();
  await refreshJobs();
  await refreshAdapters();
}

async function start() {
  if (await checkHealth()) {
    await refreshAll().catch((error) => notify(error.message));
  }
  setInterval(() => {
    if ($("health").textContent === "connected") refreshJobs().catch(() => {});
  }, JOBS_POLL_MS);
  document.body.dataset.ready = "1";
}

start();
