// toolrelay console: keeps the turns page current from the server's event
// stream (no polling), moves each bar of time left as the clock runs, and
// replays dead letters. Everything it writes into the page goes through
// textContent, never as HTML.
"use strict";

(function () {
  const $ = (sel, root) => (root || document).querySelector(sel);
  const el = (tag, props, children) => {
    const e = document.createElement(tag);
    Object.assign(e, props || {});
    for (const c of children || []) e.append(c);
    return e;
  };
  const code = (text) => el("code", { textContent: text });
  // A long platform id, shortened as the server does, whole in its title.
  const shortID = (id) => el("code", { textContent: id.length <= 18 ? id : id.slice(0, 10) + "\u2026" + id.slice(-5), title: id });

  function fmtLeft(ms) {
    if (ms < 0) return "overdue";
    const s = Math.round(ms / 1000);
    const m = Math.floor(s / 60);
    return m > 0 ? m + "m" + String(s % 60).padStart(2, "0") + "s" : s + "s";
  }
  function clock(iso) {
    if (!iso) return "-";
    return new Date(iso).toISOString().slice(11, 19);
  }

  // ---- turns page ----
  const open = $("#open-turns");
  const recent = $("#recent-turns");
  let skew = 0; // server clock minus ours, from the latest snapshot

  function setBar(row, now) {
    const deadline = Number(row.dataset.deadline), budget = Number(row.dataset.budget);
    const left = deadline - now;
    const pct = budget > 0 ? Math.max(0, Math.min(100, Math.round((left * 100) / budget))) : 0;
    const bar = $("progress", row), secs = $(".secs", row);
    bar.value = pct;
    bar.textContent = pct + "%";
    bar.className = pct < 10 ? "critical" : pct < 30 ? "low" : "";
    secs.textContent = fmtLeft(left);
  }
  function tick() {
    const now = Date.now() + skew;
    for (const row of open.tBodies[0].rows) setBar(row, now);
  }

  function openRow(t) {
    const row = el("tr");
    row.dataset.key = t.key;
    row.dataset.deadline = String(Date.parse(t.deadline));
    row.dataset.budget = String(t.budget_ms);
    const link = el("a", { href: "/ui/turns/" + encodeURIComponent(t.key) }, [code(t.key.slice(0, 12))]);
    const bar = el("progress", { max: 100, value: 0 });
    bar.setAttribute("aria-label", "time left of turn " + t.key.slice(0, 12));
    row.append(
      el("td", {}, [link]), el("td", { textContent: t.platform }), el("td", { className: "obj" }, [shortID(t.object_id)]),
      el("td", { textContent: t.teams.join(", ") }), el("td", { textContent: t.functions.join(", ") }),
      el("td", { className: "waiting", textContent: (t.waiting || []).join(", ") }),
      el("td", { textContent: clock(t.deadline) }),
      el("td", { className: "left" }, [bar, " ", el("span", { className: "secs" })]));
    setBar(row, Date.now() + skew);
    return row;
  }

  function recentRow(t) {
    const row = el("tr", { className: "fresh" });
    row.dataset.key = t.key;
    const link = el("a", { href: "/ui/turns/" + encodeURIComponent(t.key) }, [code(t.key.slice(0, 12))]);
    const outcome = el("td", {}, [el("span", { className: "outcome " + t.outcome, textContent: t.outcome })]);
    if (t.error) outcome.append(" ", el("span", { className: "why", textContent: t.error }));
    let trace = document.createTextNode("-");
    if (t.trace_id) trace = shortID(t.trace_id);
    row.append(
      el("td", {}, [link]), el("td", { textContent: t.platform }), el("td", { className: "obj" }, [shortID(t.object_id)]), outcome,
      el("td", {}, [el("a", { href: "/ui/turns/" + encodeURIComponent(t.key), textContent: t.functions.join(", ") || "details" })]),
      el("td", { textContent: t.duration || "-" }), el("td", { textContent: t.time_left_at_submit || "-" }),
      el("td", { textContent: clock(t.submitted_at) }), el("td", {}, [trace]));
    return row;
  }

  // hidden counts the open turns the table leaves out: it shows at most
  // data-limit rows, the nearest deadlines.
  let hidden = 0;
  function countOpen() {
    const body = open.tBodies[0];
    const limit = Number(open.dataset.limit || 200);
    while (body.rows.length > limit) { body.deleteRow(-1); hidden++; }
    const n = body.rows.length;
    const more = $("#hidden");
    if (more) more.textContent = String(hidden);
    $("#open-count").textContent = String(n + hidden);
    $("#open-empty").hidden = n > 0;
  }

  // A trace link is the server's to build (its TraceURL); keep the one a
  // server-rendered row has and show ids otherwise.
  function onTurn(t) {
    const body = open.tBodies[0];
    const existing = body.querySelector('tr[data-key="' + CSS.escape(t.key) + '"]');
    if (t.outcome === "open") {
      const row = openRow(t);
      if (existing) existing.replaceWith(row);
      else {
        row.classList.add("fresh");
        // keep the nearest deadline first
        const d = Date.parse(t.deadline);
        const after = Array.from(body.rows).find((r) => Number(r.dataset.deadline) > d);
        body.insertBefore(row, after || null);
      }
    } else {
      if (existing) existing.remove();
      else if (hidden > 0) hidden--; // it was open beyond the table's limit
      if (recent) {
        const rb = recent.tBodies[0];
        const old = rb.querySelector('tr[data-key="' + CSS.escape(t.key) + '"]');
        if (old) old.remove();
        rb.insertBefore(recentRow(t), rb.firstChild);
        while (rb.rows.length > Number(recent.dataset.limit || 50)) rb.deleteRow(-1);
        $("#recent-empty").hidden = true;
      }
    }
    countOpen();
  }

  function onSnapshot(list) {
    skew = Date.parse(list.now) - Date.now();
    const body = open.tBodies[0];
    body.replaceChildren(...list.open.map(openRow));
    hidden = Math.max(0, list.open_total - list.open.length);
    countOpen();
  }

  if (open) {
    skew = Number(open.dataset.now) - Date.now();
    hidden = Number(($("#hidden") || {}).textContent || 0);
    const live = $("#live");
    const es = new EventSource(open.dataset.stream);
    es.addEventListener("open", () => { live.textContent = "Live."; live.dataset.state = "live"; });
    es.addEventListener("error", () => { live.textContent = "Reconnecting…"; live.dataset.state = "reconnecting"; });
    es.addEventListener("snapshot", (e) => onSnapshot(JSON.parse(e.data)));
    es.addEventListener("turn", (e) => onTurn(JSON.parse(e.data)));
    es.addEventListener("reset", () => { live.textContent = "Catching up…"; });
    window.addEventListener("pagehide", () => es.close());
    setInterval(tick, 250);
  }

  // ---- dead letters page ----
  const letters = $("#deadletters");
  const status = $("#replay-status");

  async function replay(keys) {
    if (keys.length === 0) { status.textContent = "Select a dead letter first."; return; }
    status.textContent = "Replaying " + keys.length + "…";
    let res;
    try {
      res = await fetch("/v1/deadletters/replay", {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Toolrelay-Console": "1" },
        body: JSON.stringify({ keys: keys }),
      });
    } catch (err) { status.textContent = "Replay failed: " + err; return; }
    const body = await res.json();
    if (!res.ok) { status.textContent = "Replay refused: " + (body.error && body.error.message); return; }
    const waiting = new Map();
    const failed = [];
    for (const r of body.replays) {
      const row = letters.querySelector('tr[data-key="' + CSS.escape(r.key) + '"]');
      const cell = row && $(".replay-outcome", row);
      if (r.error) { failed.push(r.error); if (cell) cell.textContent = "not replayed: " + r.error; continue; }
      waiting.set(r.key, r.replay);
      if (cell) { cell.replaceChildren("#" + r.replay + " ", el("span", { className: "outcome pending", textContent: "running" })); }
    }
    status.textContent = waiting.size + " replayed" + (failed.length ? ", " + failed.length + " refused" : "") + "; waiting for the outcome…";
    awaitOutcomes(waiting);
  }

  // The outcome of a replay is a record the executor writes when the call
  // ends: ask for it a few times, for this page's replays only.
  async function awaitOutcomes(waiting) {
    const until = Date.now() + 60000;
    while (waiting.size > 0 && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 1000));
      const res = await fetch("/v1/deadletters" + location.search, { credentials: "same-origin" });
      if (!res.ok) continue;
      const body = await res.json();
      for (const dl of body.dead_letters) {
        const n = waiting.get(dl.key);
        if (!n || !dl.last_replay || dl.last_replay.n < n) continue;
        waiting.delete(dl.key);
        const row = letters.querySelector('tr[data-key="' + CSS.escape(dl.key) + '"]');
        const cell = row && $(".replay-outcome", row);
        if (!cell) continue;
        const r = dl.last_replay;
        cell.replaceChildren("#" + r.n + " ", el("span", { className: "outcome " + r.outcome, textContent: r.outcome }));
        if (r.error) cell.append(" " + r.error);
        if (r.output) cell.append(" ", code(r.output));
      }
    }
    status.textContent = waiting.size === 0 ? "Replays finished." : waiting.size + " replays have no outcome yet; reload later.";
  }

  if (letters) {
    letters.addEventListener("click", (e) => {
      const b = e.target.closest("button.replay");
      if (b) replay([b.dataset.key]);
    });
    $("#replay-selected").addEventListener("click", () =>
      replay(Array.from(letters.querySelectorAll("input.pick:checked")).map((c) => c.value)));
    $("#select-all").addEventListener("change", (e) => {
      for (const c of letters.querySelectorAll("input.pick")) c.checked = e.target.checked;
    });
  }

  // ---- held calls (the approvals page, and atop the turns) ----
  const held = $("#approvals");
  const heldStatus = $("#approval-status");

  async function decide(row, verb) {
    const key = row.dataset.key;
    const reason = $("input.reason", row).value.trim();
    if (verb === "deny" && reason === "") {
      heldStatus.textContent = "Give a reason to deny: the model reads it.";
      $("input.reason", row).focus();
      return;
    }
    for (const b of row.querySelectorAll("button")) b.disabled = true;
    heldStatus.textContent = (verb === "approve" ? "Approving" : "Denying") + "…";
    let res, body;
    try {
      res = await fetch("/v1/approvals/" + encodeURIComponent(key) + "/" + verb, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Toolrelay-Console": "1" },
        body: JSON.stringify({ reason: reason }),
      });
      body = await res.json();
    } catch (err) {
      heldStatus.textContent = "Not decided: " + err;
      for (const b of row.querySelectorAll("button")) b.disabled = false;
      return;
    }
    const a = res.ok ? body : body.approval;
    if (!res.ok && !a) {
      heldStatus.textContent = "Not decided: " + (body.error && body.error.message);
      for (const b of row.querySelectorAll("button")) b.disabled = false;
      return;
    }
    const by = a.state === "expired" ? "not approved in time" : a.state + " by " + a.decided_by;
    $(".decide", row).replaceChildren(el("span", { className: "outcome " + (a.state === "approved" ? "ok" : "error"), textContent: by }));
    $(".left", row).textContent = "-";
    heldStatus.textContent = res.ok ? a.function + ": " + by + "." : "Decided already: " + by + ".";
  }

  if (held) {
    held.addEventListener("click", (e) => {
      const b = e.target.closest("button.approve, button.deny");
      if (b) decide(b.closest("tr"), b.classList.contains("approve") ? "approve" : "deny");
    });
    // The time left before each call is denied automatically, counting down.
    setInterval(() => {
      for (const cell of held.querySelectorAll("td.left[data-deny-at]")) {
        const left = Number(cell.dataset.denyAt) - Date.now();
        const secs = $(".secs", cell);
        if (secs) secs.textContent = left > 0 ? Math.round(left / 1000) + "s" : "denying…";
      }
    }, 1000);
  }
})();
