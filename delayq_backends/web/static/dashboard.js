// delayq dashboard: polls the JSON API every 2 s and draws the page. No dependencies, no CDN.
"use strict";

(() => {
  const TOKEN_KEY = "delayq-token";
  const REFRESH_MS = 2000;
  const CHART_EVERY = 5; // the 24 h chart costs buckets x shards ZCOUNTs: refresh it every 10 s
  const SVG = "http://www.w3.org/2000/svg";
  const authOn = document.body.dataset.auth === "on";
  const $ = (id) => document.getElementById(id);
  let timer = null;
  let tick = 0;

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  async function api(path, { method = "GET", body } = {}) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    // every write is JSON, with or without a body: the server refuses any other write (415)
    if (method !== "GET") headers["Content-Type"] = "application/json";
    const response = await fetch(`api/v1${path}`, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await response.json().catch(() => ({ detail: response.statusText }));
    if (!response.ok) throw new ApiError(response.status, data.detail || response.statusText);
    return data;
  }

  // -- small DOM helpers (text is always set as text, never parsed as HTML) -------------------

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children) node.append(child instanceof Node ? child : String(child ?? "–"));
    return node;
  }

  function fillTable(table, columns, rows, emptyText) {
    const head = el("tr", {}, ...columns.map(([name, num]) => el("th", num ? { class: "num" } : {}, name)));
    const body = rows.length
      ? rows.map((cells) => el("tr", {}, ...cells.map((cell, i) => el("td", { class: columns[i][1] ? "num" : "wrap" }, cell))))
      : [el("tr", {}, el("td", { class: "empty", colspan: columns.length }, emptyText))];
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
  }

  function confirmButton(label, armedLabel, action, attrs = {}) {
    // Destructive actions take two clicks: the first arms the button for 4 s.
    const button = el("button", { type: "button", class: "small danger", ...attrs }, label);
    let disarm = null;
    button.addEventListener("click", async () => {
      if (!button.classList.contains("armed")) {
        button.classList.add("armed");
        button.textContent = armedLabel;
        disarm = setTimeout(() => { button.classList.remove("armed"); button.textContent = label; }, 4000);
        return;
      }
      clearTimeout(disarm);
      button.disabled = true;
      await action();
      button.disabled = false;
      button.classList.remove("armed");
      button.textContent = label;
    });
    return button;
  }

  const fmtTime = (iso) => (iso ? new Date(iso).toLocaleString(undefined, { hour12: false }) : "–");
  // a paused or finished periodic entry's item is due at the end of time: it never falls due
  const NEVER = "never (a paused or finished entry)";
  const endOfTime = (iso) => Boolean(iso) && iso.startsWith("9999-");
  const dueText = (iso) => (endOfTime(iso) ? NEVER : `${fmtTime(iso)} (${relative(iso)})`);
  const count = (n) => Number(n).toLocaleString();

  function duration(ms) {
    if (ms < 1000) return `${ms} ms`;
    const s = ms / 1000;
    if (s < 60) return `${s.toFixed(1)} s`;
    const m = Math.floor(s / 60), h = Math.floor(m / 60), d = Math.floor(h / 24);
    if (d) return `${d}d ${h % 24}h`;
    return h ? `${h}h ${String(m % 60).padStart(2, "0")}m` : `${m}m ${String(Math.floor(s) % 60).padStart(2, "0")}s`;
  }

  function relative(iso) {
    if (!iso) return "–";
    const delta = new Date(iso).getTime() - Date.now();
    return delta >= 0 ? `in ${duration(delta)}` : `${duration(-delta)} ago`;
  }

  // -- sections --------------------------------------------------------------------------------

  function showStats(stats) {
    const t = stats.totals;
    $("store").textContent = `prefix ${stats.prefix} · ${stats.shards.length} shards`;
    $("count-scheduled").textContent = count(t.scheduled);
    $("count-due").textContent = count(t.due);
    $("count-leased").textContent = count(t.leased);
    $("count-dead").textContent = count(t.dead);
    $("next-due").textContent = t.next_due ? dueText(t.next_due) : "nothing scheduled";
    $("oldest-overdue").textContent = t.due ? duration(t.oldest_overdue_ms) : "none";
    fillTable($("shards"),
      [["shard", 1], ["scheduled", 1], ["due now", 1], ["leased", 1], ["dead", 1], ["next due"], ["oldest overdue", 1]],
      stats.shards.map((s) => [s.shard, count(s.scheduled), count(s.due), count(s.leased), count(s.dead),
        s.next_due ? (endOfTime(s.next_due) ? NEVER : fmtTime(s.next_due)) : s.problem || "–", s.due ? duration(s.oldest_overdue_ms) : "–"]),
      "no shards");
    return t.problem; // shards that could not be read
  }

  let lastDue = null;

  function showChart(due) {
    lastDue = due;
    const width = Math.max(480, $("chart").clientWidth), height = 180, top = 10, bottom = 22, left = 40, right = 24;
    const n = due.counts.length, max = Math.max(1, ...due.counts);
    const step = (width - left - right) / n, plot = height - top - bottom;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(SVG, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
      return node;
    };
    add("line", { class: "axis", x1: left, x2: width - right, y1: top + plot, y2: top + plot });
    add("text", { x: left - 6, y: top + 9, "text-anchor": "end" }, count(max));
    add("text", { x: left - 6, y: top + plot, "text-anchor": "end" }, "0");
    const start = new Date(due.start).getTime(), bucketMs = due.bucket_minutes * 60000;
    due.counts.forEach((c, i) => {
      if (!c) return;
      const h = Math.max(1, (c / max) * plot);
      const bar = add("rect", { class: "bar", x: left + i * step, y: top + plot - h, width: Math.max(1, step - 0.5), height: h });
      const from = new Date(start + i * bucketMs);
      const title = document.createElementNS(SVG, "title");
      title.textContent = `${from.toLocaleTimeString(undefined, { hour12: false, hour: "2-digit", minute: "2-digit" })}: ${count(c)} due`;
      bar.append(title);
    });
    const perTick = Math.max(1, Math.round((3 * 60) / due.bucket_minutes)); // a label every 3 hours
    for (let i = 0; i <= n; i += perTick) {
      const at = new Date(start + i * bucketMs);
      add("text", { x: left + i * step, y: height - 6, "text-anchor": i ? "middle" : "start" },
        at.toLocaleTimeString(undefined, { hour12: false, hour: "2-digit", minute: "2-digit" }));
    }
    $("chart").replaceChildren(svg);
    $("chart-bucket").textContent = `(per ${due.bucket_minutes} min)`;
    const total = due.counts.reduce((a, b) => a + b, 0);
    $("chart-legend").textContent = `${count(total)} falling due in 24 h · ${count(due.overdue)} already due (not yet forwarded)`;
  }

  // "debounced: 12 calls, key user-42" (as `delayq list` shows it), "" for other items
  function where(it) {
    if (it.newer_format !== null && it.newer_format !== undefined) return `newer format ${it.newer_format}: upgrade this reader`;
    return it.corrupt ? `corrupt: ${it.corrupt}` : `${it.target} / ${it.destination}`;
  }

  function collapsed(c) {
    return c ? `${c.mode}d: ${c.calls} call${c.calls === 1 ? "" : "s"}, key ${c.key}` : "";
  }

  function showUpcoming(items) {
    fillTable($("upcoming"),
      [["id"], ["ready"], ["target / destination"], ["attempts", 1], ["leased until"], ["collapsed"]],
      items.items.map((it) => [
        el("a", { href: "#", class: "mono", onclick: (e) => { e.preventDefault(); find(it.id); } }, it.id),
        dueText(it.ready),
        where(it),
        it.attempts,
        it.leased_until ? fmtTime(it.leased_until) : "–",
        collapsed(it.collapsed),
      ]),
      "nothing scheduled");
    return items.problems.join("; "); // shards that could not be read
  }

  const PERIODIC_STATES = ["scheduled", "firing", "paused", "finished", "missing"]; // else "unreadable: why"

  // "paused", "finished" or the item's state, and what waits for the next firing
  function entryState(e) {
    const shown = e.state === "scheduled" && !e.enabled ? "paused" : e.state === "scheduled" && e.finished ? "finished" : e.state;
    const pending = [e.pending_runs ? `${e.pending_runs} run now` : "", e.pending_backfill ? `${e.pending_backfill} backfill` : ""]
      .filter(Boolean).join(", ");
    return el("span", { class: `state ${PERIODIC_STATES.includes(shown) ? shown : "unreadable"}` },
      shown, pending ? ` (${pending} pending)` : "");
  }

  function entryActions(e) {
    const attrs = (action) => ({ type: "button", class: "small", "data-action": action, "data-name": e.name });
    if (!e.kind) return ""; // unreadable or missing: nothing to act on (remove it with the CLI)
    const remove = confirmButton("Remove", e.source === "code" ? "Really remove? (a sync adds it back)" : "Really remove?",
      () => removeEntry(e), { "data-action": "remove", "data-name": e.name });
    return el("div", { class: "actions" },
      e.enabled
        ? el("button", { ...attrs("pause"), onclick: () => entryAction(e.name, "pause", "Paused", {}) }, "Pause")
        : el("button", { ...attrs("resume"), onclick: () => entryAction(e.name, "resume", "Resumed", {}) }, "Resume"),
      el("button", { ...attrs("run"), onclick: () => entryAction(e.name, "run", "Asked for a run of", {}) }, "Run now"),
      el("button", { ...attrs("backfill"), onclick: () => openBackfill(e.name) }, "Backfill"),
      el("button", { ...attrs("edit"), onclick: () => editEntry(e.name) }, "Edit"),
      remove);
  }

  // The entries a page at a time (about PERIODIC_PAGE, by name within a page): the page shown
  // starts at cursor ("0": the first); next is the following page's, null on the last.
  const PERIODIC_PAGE = 100;
  const periodicPage = { cursor: "0", number: 1, next: null };
  let shownPeriodic = "";
  // The cursor the loading refresh asked for: a page turned while it was on its way makes its
  // answer stale (it would show the old page's rows and next cursor under the new page's number)
  let periodicAsked = null;

  function turnPeriodicPage(cursor, number) {
    Object.assign(periodicPage, { cursor, number, next: null });
    shownPeriodic = "";
    refresh(false);
  }

  function showPeriodicPager(periodic) {
    periodicPage.next = periodic.next_cursor;
    $("periodic-first").hidden = periodicPage.number === 1;
    $("periodic-next").hidden = !periodic.next_cursor;
    $("periodic-page").textContent = periodicPage.number === 1 && !periodic.next_cursor
      ? "" : `page ${periodicPage.number}${periodic.next_cursor ? "" : " (the last)"}`;
  }

  function showPeriodic(periodic) {
    showPeriodicPager(periodic);
    // Redrawn when it changed, and never under an armed Remove (its second click must find it)
    const shown = JSON.stringify(periodic);
    const table = $("periodic");
    if (shown === shownPeriodic || table.querySelector(".armed")) return;
    shownPeriodic = shown;
    fillTable(table,
      [["entry"], ["kind · source"], ["task / function"], ["schedule"], ["misfire"], ["last run"], ["next run"],
        ["runs", 1], ["state"], [""]],
      periodic.entries.map((e) => [
        e.item_id
          ? el("a", { href: "#", class: "mono", onclick: (ev) => { ev.preventDefault(); find(e.item_id); } }, e.name)
          : el("span", { class: "mono" }, e.name),
        e.kind ? `${e.kind} · ${e.source}` : "–",
        e.task || "–",
        e.schedule || "–",
        e.misfire || "–",
        e.last_run ? `${fmtTime(e.last_run)}${e.last_missed ? ` (${e.last_missed} missed)` : ""}` : "never",
        e.next_run && e.enabled && !e.finished ? fmtTime(e.next_run) : "–",
        count(e.runs),
        entryState(e),
        entryActions(e),
      ]),
      periodic.hint || (periodicPage.number > 1 ? "no entries on this page any more: go to the first page" : "no periodic entries"));
  }

  function periodicMessage(text, error = false) {
    $("periodic-message").className = error ? "error" : "muted";
    $("periodic-message").textContent = text;
  }

  const entryPath = (name) => `/periodic/${encodeURIComponent(name)}`;

  async function entryAction(name, verb, done, body) {
    try {
      await api(`${entryPath(name)}/${verb}`, { method: "POST", body });
      periodicMessage(`${done} ${name}.`);
    } catch (error) {
      periodicMessage(error.message, true);
    }
    shownPeriodic = "";
    refresh(true);
  }

  async function removeEntry(e) {
    try {
      // a code entry is removed only when asked twice (the armed button says a sync adds it back)
      await api(`${entryPath(e.name)}${e.source === "code" ? "?force=true" : ""}`, { method: "DELETE" });
      periodicMessage(`Removed ${e.name}.`);
    } catch (error) {
      periodicMessage(error.message, true);
    }
    shownPeriodic = "";
    refresh(true);
  }

  // -- backfill and add/edit forms ------------------------------------------------------------------

  // datetime-local inputs read in the browser's time zone; the API takes ISO-8601 with an offset
  const isoOf = (local) => (local ? new Date(local).toISOString() : undefined);

  function localOf(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
  }

  function openBackfill(name) {
    $("backfill-name").textContent = name;
    $("backfill-form").dataset.name = name;
    $("backfill-form").hidden = false;
    $("backfill-from").focus();
  }

  function submitBackfill() {
    const name = $("backfill-form").dataset.name;
    const start = isoOf($("backfill-from").value), end = isoOf($("backfill-to").value);
    $("backfill-form").hidden = true;
    entryAction(name, "backfill", "Asked for a backfill of", { start, end });
  }

  const SCHEDULE_LABELS = { every: "Seconds", cron: "Crontab", at: "At" };
  const SCHEDULE_HINTS = { every: "300", cron: "*/5 * * * *", at: "2030-01-31T09:00:00Z" };

  function scheduleKindChanged() {
    const kind = $("entry-schedule-kind").value;
    $("entry-schedule-label").textContent = SCHEDULE_LABELS[kind];
    $("entry-schedule").placeholder = SCHEDULE_HINTS[kind];
    $("entry-tz").disabled = kind !== "cron";
    $("entry-aligned").disabled = kind !== "every";
  }

  function entryKindChanged() {
    const kind = $("entry-kind").value, rq = kind === "rq";
    $("entry-task-label").textContent = rq ? "Function" : "Task";
    $("entry-task").placeholder = rq ? "app.tasks.cleanup" : "proj.tasks.cleanup";
    for (const box of document.querySelectorAll(".run-option")) {
      box.hidden = box.dataset.kind !== kind; // each kind's run options only (the page renders them from the API's table)
      box.querySelector("input").disabled = box.hidden;
    }
  }

  // a run option as the form shows it (from the definition's options), and back as the API takes it
  function optionShown(input, value) {
    if (value === undefined || value === null) return "";
    if (input.dataset.value === "object") return JSON.stringify(value);
    if (input.dataset.value === "ints") return value.join(",");
    return String(value);
  }

  function optionValue(input) {
    const text = input.value.trim(), type = input.dataset.value;
    if (type === "object") return JSON.parse(text);
    if (type === "ints") return text.startsWith("[") ? JSON.parse(text) : text.split(",").map((part) => numberOr(part.trim()));
    if (type === "int" || type === "expires") return numberOr(text);
    return text;
  }

  async function editEntry(name) {
    try {
      openEntryForm(await api(entryPath(name))); // the list carries no definitions: one entry's
    } catch (error) {
      periodicMessage(error.message, true);
    }
  }

  let editing = {}; // the definition being edited: what the form has no field for is sent back as it was

  // The form, empty (Add entry) or holding entry e's definition (Edit)
  function openEntryForm(e) {
    const d = (e && e.definition) || {};
    editing = d;
    const scheduleKind = d.cron ? "cron" : d.at ? "at" : "every";
    $("entry-form-title").textContent = e ? `Edit ${e.name}` : "Add an entry";
    $("entry-name").value = e ? e.name : "";
    $("entry-name").readOnly = Boolean(e);
    $("entry-kind").value = (e && e.kind) || "celery";
    $("entry-task").value = (e && e.task) || "";
    $("entry-queue").value = d.queue || "";
    $("entry-schedule-kind").value = scheduleKind;
    $("entry-schedule").value = d.cron || d.at || (d.every ?? "");
    $("entry-tz").value = d.tz || "";
    $("entry-aligned").checked = Boolean(d.aligned);
    $("entry-misfire").value = d.misfire || "run_once";
    $("entry-overlap").value = d.overlap || "allow";
    $("entry-start").value = localOf(d.start);
    $("entry-end").value = localOf(d.end);
    $("entry-max-runs").value = d.max_runs ?? "";
    $("entry-jitter").value = d.jitter ?? "";
    // an RQ entry's arguments are RQ's serialized data, not shown: they must be entered again
    const unknown = Boolean(e) && (d.args === null || d.args === undefined);
    $("entry-args").value = unknown ? "" : JSON.stringify(d.args ?? []);
    $("entry-kwargs").value = unknown ? "" : JSON.stringify(d.kwargs ?? {});
    for (const id of ["entry-args", "entry-kwargs"]) {
      $(id).placeholder = unknown ? "not readable here: enter them again" : "";
      $(id).required = unknown;
    }
    for (const input of document.querySelectorAll("[data-option]")) input.value = optionShown(input, (d.options || {})[input.dataset.option]);
    $("entry-enabled").checked = e ? e.enabled : true;
    $("entry-detach").checked = false;
    $("entry-detach-box").hidden = !(e && e.source === "code");
    $("entry-message").textContent = "";
    entryKindChanged();
    scheduleKindChanged();
    $("entry-form").hidden = false;
    (e ? $("entry-task") : $("entry-name")).focus();
  }

  // a number typed as digits goes as a number; anything else as typed, for the server to say what it wants
  const numberOr = (text) => (/^-?[0-9]+(\.[0-9]+)?$/.test(text) ? Number(text) : text);

  function entryBody() {
    const value = (id) => $(id).value.trim();
    const body = { name: value("entry-name"), kind: $("entry-kind").value, enabled: $("entry-enabled").checked };
    body[body.kind === "rq" ? "func" : "task"] = value("entry-task");
    const scheduleKind = $("entry-schedule-kind").value, schedule = value("entry-schedule");
    body[scheduleKind] = scheduleKind === "every" ? numberOr(schedule) : schedule;
    if (scheduleKind === "cron" && value("entry-tz")) body.tz = value("entry-tz");
    if (scheduleKind === "every") body.aligned = $("entry-aligned").checked;
    if (value("entry-queue")) body.queue = value("entry-queue");
    for (const [key, id] of [["max_runs", "entry-max-runs"], ["jitter", "entry-jitter"]]) {
      if (value(id)) body[key] = numberOr(value(id));
    }
    for (const [key, id] of [["start", "entry-start"], ["end", "entry-end"]]) if (value(id)) body[key] = isoOf(value(id));
    body.misfire = $("entry-misfire").value;
    if (editing.misfire_grace !== undefined) Object.assign(body, { misfire_grace: editing.misfire_grace, misfire_max: editing.misfire_max });
    body.overlap = $("entry-overlap").value;
    body.args = JSON.parse(value("entry-args") || "[]");
    body.kwargs = JSON.parse(value("entry-kwargs") || "{}");
    for (const input of document.querySelectorAll("[data-option]")) {
      if (!input.disabled && input.value.trim()) body[input.dataset.option] = optionValue(input);
    }
    if ($("entry-detach").checked) body.detach = true;
    return body;
  }

  async function saveEntry() {
    const message = $("entry-message");
    let body;
    try {
      body = entryBody();
    } catch (error) {
      message.className = "error";
      message.textContent = `Args, kwargs, headers and meta must be JSON: ${error.message}`;
      return;
    }
    try {
      const saved = await api("/periodic", { method: "POST", body });
      $("entry-form").hidden = true;
      periodicMessage(saved.result === "unchanged" ? `${body.name}: nothing changed.` : `Saved ${body.name} (${saved.result}).`);
    } catch (error) {
      message.className = "error";
      message.textContent = error.message;
    }
    shownPeriodic = "";
    refresh(true);
  }

  function showLateness(late) {
    const box = $("lateness");
    if (!late.count) {
      box.replaceChildren(el("p", { class: "muted" }, late.hint || "no forwards recorded yet"));
      return;
    }
    const line = el("div", { class: "stats-line" },
      el("span", {}, "p50 ", el("b", {}, duration(late.p50_ms))),
      el("span", {}, "p95 ", el("b", {}, duration(late.p95_ms))),
      el("span", {}, "max ", el("b", {}, duration(late.max_ms))),
      el("span", { class: "muted" }, `last ${late.count} forwards`));
    const table = el("table");
    fillTable(table, [["id"], ["queue"], ["forwarded"], ["late", 1]],
      late.records.slice(0, 8).map((r) => [el("span", { class: "mono" }, r.id), r.queue, fmtTime(r.forwarded_at), duration(r.late_ms)]),
      "");
    box.replaceChildren(line, table);
  }

  // -- groups ----------------------------------------------------------------------------------------

  // The groups a page at a time, busiest first (running + parked): the page shown starts at offset
  const GROUPS_PAGE = 50;
  const groupsPage = { offset: 0 };
  // The offset the loading refresh asked for: a page turned while it was on its way makes its answer stale
  let groupsAsked = null;

  function turnGroupsPage(offset) {
    groupsPage.offset = offset;
    refresh(false);
  }

  function groupUse(g) {
    // running against the limit, as a bar; without a runtime limit the items' own applies, unknown here
    if (g.limit === null) return String(g.running);
    const meter = el("meter", { min: 0, max: g.limit, value: Math.min(g.running, g.limit), high: g.limit - 0.5 });
    return el("span", { class: "slot-use" }, meter, ` ${g.running} / ${g.limit}`);
  }

  function groupState(g) {
    const held = [];
    if (g.paused_by) held.push(`paused by ${g.paused_by}`);
    if (g.throttled_until) held.push(`throttled until ${fmtTime(g.throttled_until)}`);
    return el("span", { class: `state group-${g.held || "releasing"}`, title: g.throttled_by || "" },
      held.join("; ") || "releasing");
  }

  const unset = (text) => el("span", { title: "none set here: the items' own or a pattern's applies" }, "–");

  function groupActions(g) {
    const attrs = (action) => ({ type: "button", class: "small", "data-action": action, "data-key": g.key });
    return el("div", { class: "actions" },
      el("button", { ...attrs("edit-group"), onclick: () => editGroup(g) }, "Edit"),
      g.paused_by
        ? el("button", { ...attrs("resume-group"), onclick: () => groupAction(g.key, "resume", "Resumed") }, "Resume")
        : el("button", { ...attrs("pause-group"), onclick: () => groupAction(g.key, "pause", "Paused") }, "Pause"));
  }

  function showGroups(board) {
    const last = groupsPage.offset + board.page.length;
    const shown = board.groups > board.page.length ? ` · ${groupsPage.offset + 1}–${last} shown` : "";
    $("groups-summary").textContent = `(${count(board.groups)} groups · ${count(board.running)} running · ` +
      `${count(board.parked)} parked · ${count(board.paused)} paused · ${count(board.throttled)} throttled${shown})`;
    $("groups-first").hidden = groupsPage.offset === 0;
    $("groups-next").hidden = last >= board.groups;
    $("groups-page").textContent = groupsPage.offset === 0 && last >= board.groups
      ? "" : `page ${Math.floor(groupsPage.offset / GROUPS_PAGE) + 1}${last >= board.groups ? " (the last)" : ""}`;
    fillTable($("groups"),
      [["group"], ["limit", 1], ["rate", 1], ["weight", 1], ["running", 1], ["parked", 1], ["state"], [""]],
      board.page.map((g) => [
        el("span", { class: "mono" }, g.key),
        g.limit === null ? unset() : count(g.limit),
        g.rate === null ? unset() : g.rate,
        g.weight === null ? unset() : String(g.weight),
        groupUse(g),
        count(g.parked),
        groupState(g),
        groupActions(g),
      ]),
      groupsPage.offset ? "no groups on this page any more: go to the first page" : "no groups in use");
  }

  function editGroup(g) {
    $("group-key").value = g.key;
    $("group-limit").value = g.limit ?? "";
    $("group-rate").value = g.rate ?? "";
    $("group-weight").value = g.weight ?? "";
    $("group-limit").focus();
  }

  function groupMessage(text, error = false) {
    $("group-message").className = error ? "error" : "muted";
    $("group-message").textContent = text;
  }

  // The parts of the form filled in: "none" removes that part, digits go as a number, anything
  // else as typed, for the server to say what it wants
  function groupBody() {
    const body = {};
    for (const part of ["limit", "rate", "weight"]) {
      const text = $(`group-${part}`).value.trim();
      if (!text) continue;
      body[part] = text.toLowerCase() === "none" ? null : part === "rate" ? text : numberOr(text);
    }
    return body;
  }

  const groupPath = (key, verb = "") => `/group${verb ? `/${verb}` : ""}?key=${encodeURIComponent(key)}`;

  async function setGroup() {
    const key = $("group-key").value;
    const body = groupBody();
    if (!key) return;
    if (!Object.keys(body).length) {
      groupMessage("Enter a limit, a rate or a weight (none removes one).", true);
      return;
    }
    try {
      const g = await api(groupPath(key), { method: "POST", body });
      const parts = Object.keys(body).map((part) => `${part} ${g[part] === null ? "removed" : g[part]}`);
      groupMessage(`${g.key}: ${parts.join(", ")}.`);
    } catch (error) {
      groupMessage(error.message, true);
    }
    refresh(true);
  }

  async function groupAction(key, verb, done) {
    try {
      await api(groupPath(key, verb), { method: "POST", body: {} });
      groupMessage(`${done} ${key}.`);
    } catch (error) {
      groupMessage(error.message, true);
    }
    refresh(true);
  }

  // -- batches ---------------------------------------------------------------------------------------

  function batchProgress(b) {
    // sub-jobs finished against those added, as a bar (an empty batch has nothing to finish)
    const bar = el("progress", { max: Math.max(b.total, 1), value: b.done });
    return el("span", { class: "batch-progress" }, bar, ` ${count(b.done)} / ${count(b.total)}`);
  }

  function showBatches(board) {
    const listed = board.open + board.closed + board.completed;
    const more = listed > board.batches.length ? ` · ${board.batches.length} shown` : "";
    $("batches-summary").textContent =
      `(${count(board.open)} open · ${count(board.closed)} closed · ${count(board.completed)} completed${more})`;
    fillTable($("batches"),
      [["key"], ["progress"], ["succeeded", 1], ["failed", 1], ["state"], ["opened"], ["completed"]],
      board.batches.map((b) => [
        el("span", { class: "mono" }, b.key),
        batchProgress(b),
        count(b.succeeded),
        count(b.failed),
        el("span", { class: `state batch-${b.state}` }, b.state),
        fmtTime(b.created),
        b.completed_at ? fmtTime(b.completed_at) : "–",
      ]),
      "no batches");
    return board.problems.join("; "); // batches whose keys hold garbage: skipped
  }

  let shownDead = "";

  function showDead(dead) {
    // Redrawn only when it changed, so a purge button armed for its second click stays armed.
    const problems = dead.problems.join("; "); // shards that could not be read
    const shown = JSON.stringify(dead.items);
    if (shown === shownDead) return problems;
    shownDead = shown;
    fillTable($("dead"),
      [["id"], ["died"], ["attempts", 1], ["error"], [""]],
      dead.items.map((d) => [
        el("span", { class: "mono" }, d.id),
        fmtTime(d.died_at),
        d.attempts,
        d.error,
        el("div", { class: "actions" },
          el("button", { type: "button", class: "small", "data-action": "requeue", "data-id": d.id,
            onclick: () => deadAction("requeue", { ids: [d.id] }, () => `Requeued ${d.id}.`) }, "Requeue"),
          confirmButton("Purge", "Really purge?", () => deadAction("purge", { ids: [d.id] }, () => `Purged ${d.id}.`),
            { "data-action": "purge", "data-id": d.id })),
      ]),
      "no dead letters");
    return problems;
  }

  async function deadAction(verb, body, message) {
    try {
      const result = await api(`/dead/${verb}`, { method: "POST", body });
      $("dead-message").textContent = result.done ? message(result.done) : "Nothing to do: already gone.";
    } catch (error) {
      $("dead-message").textContent = error.message;
    }
    refresh(true);
  }

  // -- search, cancel, reschedule ----------------------------------------------------------------

  async function find(id) {
    $("search-id").value = id;
    const box = $("search-result");
    const query = `?id=${encodeURIComponent(id)}`;
    // why it is where it is: asked beside the item, and answered for a dead letter too
    const why = api(`/item/why${query}`).catch((error) => ({ state: "error", line: error.message }));
    let item;
    try {
      item = await api(`/item${query}`);
    } catch (error) {
      const answer = await why;
      const told = error.status === 404 && answer.state !== "unknown" && answer.state !== "error";
      box.replaceChildren(el("p", { class: error.status === 404 ? "muted" : "error" }, error.message),
        ...(told ? [whyLine(answer)] : []));
      return;
    }
    const rows = [["why", whyLine(await why)],
      ["id", item.id], ["shard", item.shard], ["ready", `${fmtTime(item.ready)} (${relative(item.ready)})`],
      ["target", where(item)],
      ["rank", item.rank], ["attempts", item.attempts],
      ["leased until", item.leased_until ? fmtTime(item.leased_until) : "–"], ["size", `${item.size} B`]];
    if (item.collapsed) rows.push(["collapsed", collapsed(item.collapsed)]);
    if (item.task) {  // a Celery message: what will run, as the worker will get it
      const t = item.task;
      rows.push(["task", t.task], ["args", t.args === null ? (t.argsrepr ?? "–") : JSON.stringify(t.args)],
        ["kwargs", t.kwargs === null ? (t.kwargsrepr ?? "–") : JSON.stringify(t.kwargs)],
        ["eta", t.eta ?? "–"], ["queue", t.queue], ["priority", t.priority ?? "–"]);
      if (t.note) rows.push(["note", t.note]);
      if (t.periodic) rows.push(["periodic entry", t.periodic], ["next run's task id", t.id]);
    }
    const dl = el("dl", { class: "item", id: "item-details" }, ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    const actions = el("div", { class: "actions" },
      confirmButton("Cancel item", "Really cancel?", () => cancel(item.id), { id: "cancel-item" }),
      el("button", { type: "button", class: "small", id: "postpone-item",
        onclick: () => postpone(item) }, "Postpone 1 h"));
    box.replaceChildren(dl, actions);
  }

  // the one-line answer of `delayq why`, its state as a class for the eye ("group_limit", "dead", ...)
  function whyLine(answer) {
    return el("span", { id: "item-why", class: `why why-${answer.state}`, title: answer.state }, answer.line);
  }

  async function cancel(id) {
    try {
      await api(`/item?id=${encodeURIComponent(id)}`, { method: "DELETE" });
      $("search-result").replaceChildren(el("p", { id: "search-message" }, `Cancelled ${id}.`));
    } catch (error) {
      $("search-result").replaceChildren(el("p", { class: "error", id: "search-message" }, error.message));
    }
    refresh(true);
  }

  async function postpone(item) {
    const eta = new Date(new Date(item.ready).getTime() + 3600 * 1000).toISOString();
    try {
      await api(`/item/reschedule?id=${encodeURIComponent(item.id)}`, { method: "POST", body: { eta } });
      await find(item.id);
    } catch (error) {
      $("search-result").append(el("p", { class: "error" }, error.message));
    }
    refresh(true);
  }

  // -- the loop ---------------------------------------------------------------------------------

  function setStatus(text, kind) {
    const status = $("status");
    status.textContent = text;
    status.className = `status ${kind}`;
  }

  // Each section loads and fails on its own: one unreadable value in the store shows its reason
  // in place of that section, and the others stay live.
  const SECTIONS = [
    { path: () => "/stats", show: (d) => showStats(d), boxes: ["error-totals", "error-shards"] },
    { path: () => "/items?limit=10", show: (d) => showUpcoming(d), boxes: ["error-upcoming"] },
    { path: () => "/dead?limit=50", show: (d) => showDead(d), boxes: ["error-dead"] },
    { path: () => "/lateness?limit=200", show: (d) => showLateness(d), boxes: ["error-lateness"] },
    { path: () => `/periodic?limit=${PERIODIC_PAGE}&cursor=${(periodicAsked = periodicPage.cursor)}`,
      show: (d) => (periodicAsked === periodicPage.cursor ? showPeriodic(d) : null),
      boxes: ["error-periodic"] },
    { path: () => `/groups?limit=${GROUPS_PAGE}&offset=${(groupsAsked = groupsPage.offset)}`,
      show: (d) => (groupsAsked === groupsPage.offset ? showGroups(d) : null),
      boxes: ["error-groups"] },
    { path: () => "/batches?limit=50", show: (d) => showBatches(d), boxes: ["error-batches"] },
  ];
  const CHART = { path: () => "/due?minutes=1440&bucket_minutes=5", show: (d) => showChart(d), boxes: ["error-chart"] };

  // One refresh at a time: the next starts REFRESH_MS after the last one ended, and a refresh
  // asked for while one runs (after an action) follows it, so a slow server never gets a pile
  // of overlapping requests from an open tab.
  let running = null;
  let again = null; // null, or whether the refresh asked for meanwhile draws the chart
  let generation = 0; // a new start or a token prompt ends the loop of the one before

  async function refresh(withChart = tick % CHART_EVERY === 0) {
    if (running) {
      again = Boolean(again) || withChart;
      return running;
    }
    running = load(withChart);
    try {
      await running;
    } finally {
      running = null;
    }
    if (again !== null) {
      const chart = again;
      again = null;
      await refresh(chart);
    }
  }

  async function load(withChart) {
    tick += 1;
    const chosen = withChart ? [...SECTIONS, CHART] : SECTIONS;
    const results = await Promise.allSettled(chosen.map((section) => api(section.path())));
    const denied = results.find((r) => r.status === "rejected" && [401, 403].includes(r.reason.status));
    if (denied) {
      askToken(denied.reason.status === 403 ? "That token was refused: check it and try again." : "");
      return;
    }
    $("app").hidden = false; // first, so the chart can measure its width
    $("login").hidden = true;
    const problems = [];
    results.forEach((result, i) => {
      const { show, boxes } = chosen[i];
      let problem = result.status === "rejected" ? `Not loaded: ${result.reason.message}` : null;
      let partly = null; // shown, but the server says part of it could not be read
      if (!problem) {
        try {
          partly = show(result.value) || null;
        } catch (error) {
          problem = `Not shown: ${error.message}`;
        }
      }
      for (const id of boxes) {
        $(id).hidden = !(problem || partly);
        $(id).textContent = problem || (partly ? `Incomplete: ${partly}` : "");
      }
      if (problem || partly) problems.push(problem || partly);
    });
    const at = new Date().toLocaleTimeString(undefined, { hour12: false });
    if (!problems.length) setStatus(`live · updated ${at}`, "live");
    else if (problems.length === chosen.length) setStatus(problems[0], "down");
    else setStatus(`partly live · ${problems.length} of ${chosen.length} sections incomplete · updated ${at}`, "partial");
  }

  function start() {
    clearTimeout(timer);
    tick = 0;
    const mine = ++generation;
    const loop = async () => {
      await refresh();
      if (mine === generation) timer = setTimeout(loop, REFRESH_MS);
    };
    loop();
  }

  function askToken(problem) {
    generation += 1;
    clearTimeout(timer);
    sessionStorage.removeItem(TOKEN_KEY);
    $("app").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = problem;
    setStatus("not connected", "");
    $("token").focus();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      start();
    });
    window.addEventListener("resize", () => { if (lastDue) showChart(lastDue); });
    $("change-token").hidden = !authOn;
    $("change-token").addEventListener("click", () => askToken(""));
    $("search").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = $("search-id").value.trim();
      if (id) find(id);
    });
    $("requeue-all").addEventListener("click", () => deadAction("requeue", { all: true }, (n) => `Requeued ${n} dead letters.`));
    $("group-form").addEventListener("submit", (event) => { event.preventDefault(); setGroup(); });
    $("groups-next").addEventListener("click", () => turnGroupsPage(groupsPage.offset + GROUPS_PAGE));
    $("groups-first").addEventListener("click", () => turnGroupsPage(0));
    $("periodic-add").addEventListener("click", () => openEntryForm(null));
    $("periodic-next").addEventListener("click", () => {
      if (periodicPage.next) turnPeriodicPage(periodicPage.next, periodicPage.number + 1);
    });
    $("periodic-first").addEventListener("click", () => turnPeriodicPage("0", 1));
    $("entry-kind").addEventListener("change", entryKindChanged);
    $("entry-schedule-kind").addEventListener("change", scheduleKindChanged);
    $("entry-form").addEventListener("submit", (event) => { event.preventDefault(); saveEntry(); });
    $("entry-cancel").addEventListener("click", () => { $("entry-form").hidden = true; });
    $("backfill-form").addEventListener("submit", (event) => { event.preventDefault(); submitBackfill(); });
    $("backfill-cancel").addEventListener("click", () => { $("backfill-form").hidden = true; });
    const purgeAll = $("purge-all");
    purgeAll.replaceWith(confirmButton("Purge all", "Really purge all?",
      () => deadAction("purge", { all: true }, (n) => `Purged ${n} dead letters.`), { id: "purge-all" }));
    if (authOn && !sessionStorage.getItem(TOKEN_KEY)) askToken("");
    else start();
  });
})();
