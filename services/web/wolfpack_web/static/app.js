// Wolfpack web view: live spectating, replay, training curves. Plain JS, no build step. Every value from
// the server is put into the page as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { timers: [], live: null, replay: null, run: null };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function seatName(seat) { return seat >= 0 ? `P${seat + 1}` : "game"; }

async function api(path, options = {}) {
  const resp = await fetch(path, options);
  if (resp.status === 304) return { notModified: true, resp };
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (!resp.ok) {
    const message = body && body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${resp.status}`;
    throw new Error(message);
  }
  return { body, resp };
}

function setStatus(text) { $("status").textContent = text || ""; }

function every(ms, fn) {
  const id = setInterval(fn, ms);
  state.timers.push(id);
  return id;
}

function stopTimers() { state.timers.forEach(clearInterval); state.timers = []; }

// --- routing -----------------------------------------------------------------------------------------

function route() {
  stopTimers();
  setStatus("");
  const parts = (location.hash || "#/live").slice(2).split("/").map(decodeURIComponent);
  const page = ["live", "replay", "training"].includes(parts[0]) ? parts[0] : "live";
  for (const name of ["live", "replay", "training"]) {
    $(`page-${name}`).hidden = name !== page;
    $(`nav-${name}`).classList.toggle("active", name === page);
  }
  if (page === "live") showLive(parts[1]);
  if (page === "replay") showReplay(parts[1], parts[2], parts[3], parts[4]);
  if (page === "training") showTraining(parts[1]);
}

// --- live --------------------------------------------------------------------------------------------

let gamesLoaded = false;

async function loadGames() {
  if (gamesLoaded) return;
  const { body } = await api("/api/games");
  const game = $("start-game");
  game.replaceChildren();
  for (const g of body.games) game.append(el("option", { value: g.game_id, text: g.game_id }));
  const fillVariants = () => {
    const g = body.games.find((x) => x.game_id === game.value);
    $("start-variant").replaceChildren(
      ...(g ? g.variants : []).map((v) => el("option", { value: v.name, text: `${v.name} (${v.num_seats} seats)` })));
    if (g && g.game_id === "werewolf_v1") $("start-variant").value = "9p";
    $("start-bots").replaceChildren(...(g ? g.bots : []).map((b) => el("option", { value: b, text: b })));
  };
  game.onchange = fillVariants;
  if (body.games.some((g) => g.game_id === "werewolf_v1")) game.value = "werewolf_v1";
  fillVariants();
  gamesLoaded = true;
}

const episodePages = { filter: "", tokens: [""] };  // the list's filter and the page tokens walked so far

function episodeLabel(e) {
  const where = e.done ? "finished" + (e.winner ? ": " + e.winner + " win" : "")
    : "running" + (e.phase ? ` · ${e.phase}${e.round ? " " + e.round : ""}` : "");
  return `${e.game || "episode"} ${e.variant || ""} · ${where}`;
}

async function refreshEpisodes(selected) {
  const token = episodePages.tokens[episodePages.tokens.length - 1];
  const query = new URLSearchParams({ status: episodePages.filter });
  if (token) query.set("page_token", token);
  const { body } = await api(`/api/episodes?${query}`);
  if (!body.spectate) {
    $("episode-list").replaceChildren(el("li", { text: "Spectating is switched off here." }));
    $("start-button").disabled = true;
    return body;
  }
  $("episode-problem").hidden = !body.problem;
  $("episode-problem").textContent = body.problem || "";
  $("episode-list").replaceChildren(...(body.episodes.length ? body.episodes.map((e) => {
    const who = e.origin === "environment" ? (e.played_seats ? `${e.played_seats} of ${e.num_seats} seats played from outside` : "all seats scripted") : `${e.origin} here`;
    const li = el("li", { class: e.episode_id === selected ? "active" : "", "data-episode": e.episode_id, "data-done": String(e.done) },
      el("a", { href: `#/live/${encodeURIComponent(e.episode_id)}`, text: episodeLabel(e) }),
      el("div", { class: "hint", text: `${e.episode_id} · ${who}${e.seed !== undefined ? " · seed " + e.seed : ""}` }));
    return li;
  }) : [el("li", { class: "hint", text: "no episodes" })]));
  $("episodes-older").hidden = !body.next_page_token;
  $("episodes-older").dataset.token = body.next_page_token || "";
  $("episodes-newest").hidden = episodePages.tokens.length <= 1;
  return body;
}

$("episode-filter").addEventListener("change", () => {
  episodePages.filter = $("episode-filter").value;
  episodePages.tokens = [""];
  refreshEpisodes(state.live && state.live.id).catch((err) => setStatus(err.message));
});
$("episodes-older").addEventListener("click", () => {
  episodePages.tokens.push($("episodes-older").dataset.token);
  refreshEpisodes(state.live && state.live.id).catch((err) => setStatus(err.message));
});
$("episodes-newest").addEventListener("click", () => {
  episodePages.tokens = [""];
  refreshEpisodes(state.live && state.live.id).catch((err) => setStatus(err.message));
});

function renderSeats(container, seats) {
  container.replaceChildren(...seats.map((s) => {
    const wolf = /wolf/.test(s.role);
    const card = el("div", { class: `seat${s.alive ? "" : " dead"}${wolf ? " wolf" : ""}`, "data-seat": String(s.seat) },
      el("div", { text: `${seatName(s.seat)}${s.alive ? "" : " ✝"}` }),
      el("div", { class: "role", text: s.role || "?" }));
    if (s.outcome && s.outcome !== "unspecified") card.append(el("div", { class: "outcome", text: s.outcome }));
    return card;
  }));
}

function describeEvent(e) {
  const who = seatName(e.actor);
  const whom = e.target >= 0 ? seatName(e.target) : "";
  switch (e.kind) {
    case "speech": case "last_words": case "wolf_speech": case "statement":
      return `${who}: “${e.text}”`;
    case "vote": case "wolf_vote": return `${who} votes ${whom || "(abstains)"}`;
    case "death": return `${whom || who} died${e.text ? " (" + e.text + ")" : ""}`;
    case "wolf_kill": return `the wolves pick ${whom}`;
    case "inspect": return `${who} inspects ${whom}: ${e.text}`;
    case "night": return `Night ${e.round}`;
    case "day": return `Day ${e.round}`;
    case "game_over": return `Game over${e.text ? ": " + e.text : ""}`;
    default: {
      const parts = [e.kind.replace(/_/g, " ")];
      if (e.actor >= 0) parts.push(who);
      if (whom) parts.push("→ " + whom);
      if (e.text) parts.push(e.text);
      return parts.join(" ");
    }
  }
}

function eventItem(e) {
  const channel = e.channel || "public";
  const cls = [];
  if (e.kind === "night" || e.kind === "day" || e.kind === "game_over") cls.push("phase-change");
  if (channel.startsWith("seat:")) cls.push("private");
  if (channel.startsWith("team:")) cls.push("team");
  if (e.kind === "death") cls.push("death");
  const li = el("li", { class: cls.join(" "), "data-kind": e.kind });
  li.append(el("span", { class: "tag", text: `#${e.index} ${e.phase || ""} ${channel === "public" ? "" : channel}` }));
  li.append(document.createTextNode(describeEvent(e)));
  return li;
}

function renderHeader(view, titleEl, phaseEl, winnerEl) {
  titleEl.textContent = `${view.game} ${view.variant} · seed ${view.seed} · ${view.episode_id}`;
  phaseEl.textContent = view.done ? `finished after round ${view.round}` : `round ${view.round} · ${view.phase}`;
  winnerEl.hidden = !view.done;
  winnerEl.textContent = view.done ? `Winner: ${view.winner || "none (draw)"}` : "";
  if (view.error) setStatus(view.error);
}

async function showLive(episodeId) {
  try {
    await loadGames();
  } catch (err) { setStatus(err.message); }
  await refreshEpisodes(episodeId).catch((err) => setStatus(err.message));
  every(2000, () => refreshEpisodes(episodeId).catch(() => {}));
  $("live-view").hidden = !episodeId;
  $("live-empty").hidden = !!episodeId;
  if (!episodeId) return;
  $("events").replaceChildren();
  $("seats").replaceChildren();
  const live = { id: episodeId, since: 0, done: false, busy: false };
  state.live = live;
  const poll = async () => {
    if (live.busy || live.done || state.live !== live) return;
    live.busy = true;
    try {
      const { body } = await api(`/api/episodes/${encodeURIComponent(episodeId)}?since=${live.since}`);
      renderHeader(body, $("live-title"), $("live-phase"), $("live-winner"));
      renderSeats($("seats"), body.seats);
      const list = $("events");
      for (const e of body.events) list.append(eventItem(e));
      if (body.events.length) list.scrollTop = list.scrollHeight;
      live.since = body.since + body.events.length;
      live.done = body.done && live.since >= body.events_total;
      $("live-view").dataset.done = String(live.done);
      if (live.done) refreshEpisodes(episodeId).catch(() => {});
    } catch (err) {
      setStatus(err.message);
      if (err.message.startsWith("NOT_FOUND")) live.done = true;  // gone (environment restarted): stop asking
    } finally {
      live.busy = false;
    }
  };
  await poll();
  every(400, poll);
}

$("start-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const { body } = await api("/api/episodes", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        game: $("start-game").value, variant: $("start-variant").value,
        seed: Number($("start-seed").value || 0), pace_ms: Number($("start-pace").value || 0),
        bots: $("start-bots").value,
      }),
    });
    const live = $("start-bots").value === "paced-random";
    location.hash = `#/${live ? "live" : "replay/episode"}/${encodeURIComponent(body.episode_id)}`;
  } catch (err) { setStatus(err.message); }
});

// --- replay ------------------------------------------------------------------------------------------

async function refreshReplaySources(kind, id) {
  api("/api/episodes?status=finished").then(({ body }) => {
    const done = body.episodes.filter((e) => e.done);
    $("replay-episodes").replaceChildren(...(done.length ? done.map((e) => el("li", { class: kind === "episode" && id === e.episode_id ? "active" : "" },
      el("a", { href: `#/replay/episode/${encodeURIComponent(e.episode_id)}`, text: `${e.game} ${e.variant} · ${e.winner || "draw"}` }),
      el("div", { class: "hint", text: e.episode_id }))) : [el("li", { class: "hint", text: "none yet" })]));
  }).catch(() => {});
  api("/api/stream?count=50").then(({ body }) => {
    $("stream-list").replaceChildren(...(body.entries.length ? body.entries.map((e) => el("li", { class: kind === "entry" && id === e.entry_id ? "active" : "" },
      el("a", { href: `#/replay/entry/${encodeURIComponent(e.entry_id)}`, text: e.error ? `${e.entry_id} (${e.error})` : `${e.game} ${e.variant} · ${e.turns} turns · ${e.winner || "-"}` }),
      el("div", { class: "hint", text: e.trajectory_id || e.entry_id }))) : [el("li", { class: "hint", text: "the stream is empty" })]));
  }).catch((err) => $("stream-list").replaceChildren(el("li", { class: "hint", text: err.message })));
}

function showReplay(kind, id, step, file) {
  refreshReplaySources(kind, id);
  if (kind === "episode" && id) loadEpisodeReplay(id);
  else if (kind === "entry" && id) loadTrajectory(`/api/stream/${encodeURIComponent(id)}`);
  else if (kind === "run" && id && step && file) {
    // an evaluated episode of a training run (the training page links here)
    loadTrajectory(`/api/runs/${encodeURIComponent(id)}/episodes/${encodeURIComponent(step)}/${encodeURIComponent(file)}`);
  }
  else if (kind !== "file") { $("replay-view").hidden = true; $("replay-empty").hidden = false; }
}

async function loadEpisodeReplay(id) {
  try {
    const { body } = await api(`/api/episodes/${encodeURIComponent(id)}?since=0`);
    if (!body.done) throw new Error("this episode is still running: watch it on the Live page");
    openReplay({ type: "episode", view: body, steps: body.events });
  } catch (err) { setStatus(err.message); }
}

async function loadTrajectory(url, options) {
  try {
    const { body } = await api(url, options);
    openReplay({ type: "trajectory", traj: body, steps: body.turns });
  } catch (err) { setStatus(err.message); }
}

function openReplay(r) {
  r.index = 0;
  state.replay = r;
  $("replay-empty").hidden = true;
  $("replay-view").hidden = false;
  if (r.type === "episode") {
    const v = r.view;
    $("replay-title").textContent = `Episode ${v.episode_id}`;
    $("replay-meta").textContent = `${v.game} ${v.variant} · seed ${v.seed} · ${v.events_total} events`;
    $("replay-outcome").textContent = `Winner: ${v.winner || "none (draw)"} · ` +
      v.seats.map((s) => `${seatName(s.seat)} ${s.role} ${s.outcome}`).join(", ");
  } else {
    const t = r.traj;
    $("replay-title").textContent = `Trajectory ${t.trajectory_id || "(no id)"}`;
    const seats = t.seats.map((s) => `${seatName(s.seat)} ${s.policy || s.bot || s.controller}`).join(", ");
    $("replay-meta").textContent = `${t.game} ${t.variant} · seed ${t.seed} · episode ${t.episode_id} · ${t.turns.length} turns · ${seats}`;
    $("replay-outcome").textContent = `Winner: ${t.winner || "-"} · ` +
      t.outcomes.map((o) => `${seatName(o.seat)} ${o.role} ${o.outcome} ${o.final_reward.toFixed(2)}`).join(", ");
  }
  renderStep();
}

function tokenChip(id, logprob) {
  const chip = el("span", { class: "tok", text: String(id) });
  if (logprob !== null) {
    const p = Math.exp(logprob);
    chip.title = `token ${id}: logprob ${logprob.toFixed(3)} (p ${p.toFixed(3)})`;
    chip.style.background = `hsl(${Math.round(120 * p)}, 60%, 82%)`;
  }
  return chip;
}

function turnView(t, n) {
  const box = el("div", { class: "turn", "data-turn": String(n) });
  box.append(el("h3", { text: `Turn ${t.index} · ${seatName(t.seat)} · ${t.phase} · round ${t.round}${t.policy ? " · " + t.policy : ""}` }));
  const valid = el("span", { class: `badge ${t.valid ? "ok" : "bad"}`, text: t.valid ? "valid" : "invalid" });
  const line = el("div", {}, valid);
  if (!t.valid && t.invalid_reason) line.append(" " + t.invalid_reason);
  if (t.defaulted) line.append(" · default action applied");
  if (t.attempt) line.append(` · attempt ${t.attempt}`);
  box.append(line);
  box.append(el("div", { text: `Prompt (${t.prompt_tokens} tokens)` }), el("pre", { class: "prompt", text: t.prompt }));
  box.append(el("div", { text: `Response (${t.response_tokens} tokens, ${t.finish_reason})` }), el("pre", { class: "response", text: t.response }));
  const a = t.action;
  box.append(el("div", { class: "action", text: a ? `Parsed action: ${a.kind}${a.target !== null ? " → " + seatName(a.target) : ""}${a.text ? " “" + a.text + "”" : ""}` : "Parsed action: none" }));
  const table = el("table", { class: "components" });
  table.append(el("tr", {}, el("td", { text: "reward" }), el("td", { text: t.reward.toFixed(4) })));
  for (const [k, v] of Object.entries(t.reward_components)) table.append(el("tr", {}, el("td", { text: k }), el("td", { text: v.toFixed(4) })));
  box.append(table);
  if (t.prediction) box.append(el("div", { text: `Prediction: ${t.prediction}` }));
  if (t.tokens.length) {
    box.append(el("div", { text: "Response tokens (colour: probability)" }));
    box.append(el("div", { class: "tokens" }, ...t.tokens.map(([id, lp]) => tokenChip(id, lp))));
  }
  return box;
}

function renderStep() {
  const r = state.replay;
  const n = r.steps.length;
  $("replay-counter").textContent = n ? `${r.type === "episode" ? "Event" : "Turn"} ${r.index + 1} / ${n}` : "nothing to step through";
  const out = $("replay-step");
  out.replaceChildren();
  if (!n) return;
  if (r.type === "trajectory") out.append(turnView(r.steps[r.index], r.index));
  else {
    const list = el("ol", { class: "events" });
    for (const e of r.steps.slice(0, r.index + 1)) list.append(eventItem(e));
    out.append(list);
    list.scrollTop = list.scrollHeight;
  }
}

function step(delta, absolute) {
  const r = state.replay;
  if (!r || !r.steps.length) return;
  r.index = absolute !== undefined ? absolute : Math.min(r.steps.length - 1, Math.max(0, r.index + delta));
  renderStep();
}

$("replay-prev").onclick = () => step(-1);
$("replay-next").onclick = () => step(1);
$("replay-first").onclick = () => step(0, 0);
$("replay-last").onclick = () => state.replay && step(0, state.replay.steps.length - 1);
$("stream-refresh").onclick = () => refreshReplaySources();
document.addEventListener("keydown", (ev) => {
  if ($("page-replay").hidden || ev.target.tagName === "INPUT") return;
  if (ev.key === "ArrowRight") step(1);
  if (ev.key === "ArrowLeft") step(-1);
});
$("trajectory-file").addEventListener("change", async () => {
  const file = $("trajectory-file").files[0];
  if (!file) return;
  const data = await file.arrayBuffer();
  const first = new Uint8Array(data.slice(0, 64)).find((b) => b > 32);
  const type = first === 123 ? "application/json" : "application/octet-stream";  // 123: "{"
  if (location.hash !== "#/replay/file") location.hash = "#/replay/file";
  await loadTrajectory("/api/trajectory", { method: "POST", headers: { "Content-Type": type }, body: data });
});

// --- training ----------------------------------------------------------------------------------------

const COLORS = ["#2456a6", "#b3261e", "#1b6e3a", "#8a5a00", "#6a3d9a", "#00838f", "#c2185b", "#555"];

function chart(panel) {
  const W = 420, H = 200, L = 44, R = 8, T = 8, B = 22;
  const xs = [], ys = [];
  for (const s of panel.series) {
    for (const [x, y] of s.points) { xs.push(x); ys.push(y); }
    for (const [x, lo, hi] of s.band) { xs.push(x); ys.push(lo, hi); }
  }
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    svg.append(n);
    return n;
  };
  add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999" });
  add("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#999" });
  add("text", { x: 2, y: T + 10, "font-size": 10, fill: "#666" }, y1.toPrecision(3));
  add("text", { x: 2, y: H - B, "font-size": 10, fill: "#666" }, y0.toPrecision(3));
  add("text", { x: L, y: H - 6, "font-size": 10, fill: "#666" }, `update ${x0}`);
  add("text", { x: W - R - 60, y: H - 6, "font-size": 10, fill: "#666" }, `update ${x1}`);
  const legend = el("div", { class: "legend" });
  panel.series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    if (s.band.length) {
      const upper = s.band.map(([x, , hi]) => `${sx(x)},${sy(hi)}`);
      const lower = s.band.slice().reverse().map(([x, lo]) => `${sx(x)},${sy(lo)}`);
      add("polygon", { points: [...upper, ...lower].join(" "), fill: color, "fill-opacity": 0.18, stroke: "none", class: "band" });
      for (const [x, lo, hi] of s.band) {  // error bars: a band of one evaluation has no width
        add("line", { x1: sx(x), y1: sy(lo), x2: sx(x), y2: sy(hi), stroke: color, "stroke-width": 1, class: "ci" });
        for (const y of [lo, hi]) add("line", { x1: sx(x) - 3, y1: sy(y), x2: sx(x) + 3, y2: sy(y), stroke: color, "stroke-width": 1 });
      }
    }
    const pts = s.points.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" ");
    add("polyline", { points: pts, fill: "none", stroke: color, "stroke-width": 1.6, class: "series", "data-key": s.key });
    if (s.points.length < 40) for (const [x, y] of s.points) add("circle", { cx: sx(x), cy: sy(y), r: 2.2, fill: color });
    const item = el("span", { text: `■ ${s.key}${s.band.length ? " (95% CI)" : ""}` });
    item.style.color = color;
    legend.append(item);
  });
  return el("div", { class: "chart", "data-title": panel.title }, el("h3", { text: panel.title }), svg, legend);
}

async function refreshRuns(selected) {
  const { body } = await api("/api/runs");
  $("run-list").replaceChildren(...(body.runs.length ? body.runs.map((name) => el("li", { class: name === selected ? "active" : "" },
    el("a", { href: `#/training/${encodeURIComponent(name)}`, text: name }))) : [el("li", { class: "hint", text: "no runs yet" })]));
}

async function showTraining(name) {
  await refreshRuns(name).catch((err) => setStatus(err.message));
  every(5000, () => refreshRuns(name).catch(() => {}));
  $("training-view").hidden = !name;
  $("training-empty").hidden = !!name;
  if (!name) return;
  const run = { name, etag: null, step: null, busy: false };
  state.run = run;
  $("charts").replaceChildren();
  $("samples").replaceChildren();
  $("eval-episodes").replaceChildren();
  const poll = async () => {
    if (run.busy || state.run !== run) return;
    run.busy = true;
    try {
      const headers = run.etag ? { "If-None-Match": run.etag } : {};
      const res = await api(`/api/runs/${encodeURIComponent(name)}/metrics`, { headers });
      if (res.notModified) return;
      run.etag = res.resp.headers.get("ETag");
      const m = res.body;
      $("run-title").textContent = `Run ${m.run}`;
      const latest = Object.entries(m.latest).map(([k, v]) => `${k} ${v.toFixed(3)}`).join(" · ");
      $("run-latest").textContent = `${m.updates} updates (last ${m.last_step ?? "-"})${latest ? " · " + latest : ""}`;
      $("run-latest").dataset.updates = String(m.updates);
      $("charts").replaceChildren(...m.panels.map(chart));
      if (m.last_step !== run.step) {
        run.step = m.last_step;
        loadSamples(name);
        loadEvalEpisodes(name);
      }
    } catch (err) {
      setStatus(err.message);
    } finally {
      run.busy = false;
    }
  };
  await poll();
  every(1500, poll);
}

async function loadSamples(name) {
  try {
    const { body } = await api(`/api/runs/${encodeURIComponent(name)}/samples`);
    $("samples").replaceChildren(...(body.samples.length ? body.samples.map((s) => el("div", { class: "sample" },
      el("div", { class: "meta", text: `${s.tag} · update ${s.step}` }), el("pre", { text: s.text })))
      : [el("div", { class: "hint", text: "no sample games logged yet (the trainer writes them at each evaluation)" })]));
  } catch (err) { setStatus(err.message); }
}

function replayHref(run, e) {
  return `#/replay/run/${encodeURIComponent(run)}/${e.step}/${encodeURIComponent(e.file)}`;
}

async function loadEvalEpisodes(name) {
  try {
    const { body } = await api(`/api/runs/${encodeURIComponent(name)}/episodes`);
    $("eval-episodes").replaceChildren(...(body.episodes.length ? body.episodes.map((e) => el("li", { "data-step": String(e.step) },
      el("a", { href: replayHref(body.run, e), text: e.error ? `update ${e.step} · ${e.file} (${e.error})`
        : `update ${e.step} · seed ${e.seed} · ${e.turns} turns · winner ${e.winner || "-"}` +
          (e.trainee_reward === null ? "" : ` · trainee reward ${e.trainee_reward.toFixed(2)}`) })))
      : [el("li", { class: "hint", text: "no evaluated episodes yet (the trainer keeps a few per evaluation in <run>/eval/)" })]));
  } catch (err) { setStatus(err.message); }
}

window.addEventListener("hashchange", route);
route();
