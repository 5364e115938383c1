// configpin dashboard: reads the JSON the dashboard serves (the same that other tools may read),
// redraws the view shown whenever the server says the cluster moved (server-sent events), and
// sends changes with the token only the served page knows. No inline script, no framework, no
// asset from elsewhere: the page works offline.
"use strict";

(function () {
  const TOKEN = document.querySelector('meta[name="configpin-token"]').content;
  const view = document.getElementById("view");
  const SVG = "http://www.w3.org/2000/svg";
  let current = null; // the route shown: {name, args}
  let loading = false;
  let again = false;
  let lastVersion = -1;
  let oneNamespace = false; // the dashboard shows one namespace: no namespace column
  const messages = {}; // a change's id -> the last answer to one of its buttons
  const refusals = {}; // "kind/namespace/name" -> the API server's refusal of a press there

  // --- building the page (text only: names come from tenants, never as HTML)
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  function s(tag, attrs) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return el;
  }
  function badge(state, text) {
    return h("span", { class: "badge " + state, "data-state": state }, text || state);
  }
  // plain words: no backticks, and an Event's reason name (ConfigRolloutComplete) as words
  // and a change's record id (ns/configmap/cfg@18e7b75eea7b311f41bd) as the change of its source
  function plain(text) {
    return String(text || "")
      .replace(/`/g, "")
      .replace(/(?:[a-z0-9][-a-z0-9.]*\/)?(configmap|secret)\/([-a-z0-9.]+)@[0-9a-f]{6,}/g,
        (_, kind, name) => "the change of " + (kind === "secret" ? "Secret " : "ConfigMap ") + name);
  }
  function reasonWords(name) {
    const words = String(name).replace(/^Config/, "").replace(/([a-z])([A-Z])/g, "$1 $2").toLowerCase();
    return words.charAt(0).toUpperCase() + words.slice(1);
  }
  function duration(sec) {
    sec = Math.max(0, Math.round(sec));
    if (sec < 60) return sec + " s";
    if (sec < 3600) return Math.floor(sec / 60) + " min " + (sec % 60) + " s";
    return Math.floor(sec / 3600) + " h " + Math.floor((sec % 3600) / 60) + " min";
  }
  function ago(t) {
    if (!t) return "-";
    const sec = Math.max(0, Math.round(Date.now() / 1000 - t));
    if (sec < 60) return sec + "s ago";
    if (sec < 3600) return Math.floor(sec / 60) + "m ago";
    if (sec < 86400) return Math.floor(sec / 3600) + "h ago";
    return Math.floor(sec / 86400) + "d ago";
  }
  function when(t) {
    return t ? new Date(t * 1000).toISOString().replace(".000", "") : "";
  }
  function clock(t) {
    return new Date(t * 1000).toTimeString().slice(0, 8);
  }
  // the wall-clock time with its zone, as the browser's clock reads it (14:03:05 UTC)
  function zoned(t) {
    return new Date(t * 1000).toLocaleTimeString("en-GB", { timeZoneName: "short" });
  }
  function zone() {
    const parts = new Intl.DateTimeFormat("en-GB", { timeZoneName: "short" }).formatToParts(new Date());
    const found = parts.find((p) => p.type === "timeZoneName");
    return found ? found.value : "";
  }
  function source(kind, ns, name) {
    return (kind === "secret" ? "Secret " : "ConfigMap ") + (ns ? ns + "/" : "") + name;
  }

  // --- talking to the server
  async function get(path) {
    const r = await fetch(path, { headers: { Accept: "application/json" } });
    const doc = await r.json();
    if (!r.ok) throw new Error(doc.error || r.status + " " + r.statusText);
    return doc;
  }
  async function post(path, body) {
    const r = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Configpin-Token": TOKEN },
      body: JSON.stringify(body),
    });
    return { ok: r.ok, status: r.status, doc: await r.json() };
  }

  // --- routes: #/changes, #/change/<id>, #/sources, #/source/<kind>/<ns>/<name>,
  //     #/workloads, #/preview; ?q= and page kept in the hash
  function route() {
    const hash = location.hash.replace(/^#\/?/, "") || "changes";
    const [pathPart, queryPart] = hash.split("?");
    const parts = pathPart.split("/").map(decodeURIComponent);
    const query = new URLSearchParams(queryPart || "");
    return { name: parts[0], args: parts.slice(1), query };
  }
  function go(name, args, query) {
    const path = [name, ...(args || []).map(encodeURIComponent)].join("/");
    const q = query && query.toString();
    location.hash = "#/" + path + (q ? "?" + q : "");
  }

  async function overview() {
    const doc = await get("/api/overview");
    oneNamespace = doc.scope.startsWith("namespace ");
    document.getElementById("scope").textContent =
      doc.scope + (doc.context ? " · context " + doc.context : "");
    // whose rights the buttons act with, as the API server names them (or the kubeconfig)
    const who = document.getElementById("who");
    who.dataset.reviewed = String(doc.who.reviewed);
    who.replaceChildren("acting as ", h("strong", { "data-testid": "who-user" }, doc.who.user),
      h("span", { class: "who-said" }, " " + doc.who.said));
    const problems = document.getElementById("problems");
    problems.replaceChildren(...doc.errors.map((e) => h("p", {}, e)));
    document.getElementById("said").textContent =
      "Records are shown " + doc.said + ". A change's waves, what each workload waits for and its verdict are as configpin's ConfigRollout of its source says them.";
    return doc;
  }

  async function draw() {
    if (loading) {
      again = true;
      return;
    }
    loading = true;
    try {
      do {
        again = false;
        current = route();
        for (const a of document.querySelectorAll("nav a")) {
          const on =
            a.dataset.view === current.name ||
            (a.dataset.view === "changes" && current.name === "change") ||
            (a.dataset.view === "sources" && current.name === "source");
          a.classList.toggle("on", on);
        }
        try {
          await overview();
          const node = await VIEWS[current.name in VIEWS ? current.name : "changes"](current);
          if (node) {
            const keep = document.activeElement && document.activeElement.id;
            const caret = keep && document.activeElement.selectionStart;
            view.replaceChildren(node);
            if (keep) {
              const el = document.getElementById(keep);
              if (el) {
                el.focus();
                if (caret !== null && el.setSelectionRange) el.setSelectionRange(caret, caret);
              }
            }
          }
          view.dataset.loaded = String(lastVersion);
        } catch (e) {
          view.replaceChildren(h("p", { class: "message refused" }, "Could not load: " + e.message));
        }
      } while (again);
    } finally {
      loading = false;
    }
  }

  function searchBox(r, placeholder) {
    return h("input", {
      type: "search",
      id: "q",
      placeholder,
      "aria-label": placeholder,
      value: r.query.get("q") || "",
      onchange: (ev) => {
        const q = new URLSearchParams(r.query);
        q.set("q", ev.target.value);
        q.delete("page");
        go(r.name, r.args, q);
      },
    });
  }
  function pager(r, doc) {
    if (doc.pages <= 1) return h("div", { class: "pager quiet" }, doc.total + " in all");
    const to = (page) => {
      const q = new URLSearchParams(r.query);
      q.set("page", String(page));
      go(r.name, r.args, q);
    };
    return h(
      "div",
      { class: "pager" },
      h("button", { class: "plain", disabled: doc.page <= 1, onclick: () => to(doc.page - 1) }, "‹ previous"),
      h("span", { "data-testid": "page" }, "page " + doc.page + " of " + doc.pages + " (" + doc.total + ")"),
      h("button", { class: "plain", disabled: doc.page >= doc.pages, onclick: () => to(doc.page + 1) }, "next ›")
    );
  }
  function withQuery(path, r, extra) {
    const q = new URLSearchParams(extra || {});
    for (const k of ["q", "page"]) if (r.query.get(k)) q.set(k, r.query.get(k));
    return path + "?" + q.toString();
  }

  // --- Changes
  function progress(counts) {
    const order = ["complete", "rolling", "waiting", "pending", "checking", "failed", "left"];
    return h(
      "span",
      { class: "chips" },
      order.filter((k) => counts[k]).map((k) => h("span", { class: "chip" }, badge(k), " " + counts[k]))
    );
  }
  function keysText(c) {
    if (c.keys === null || c.keys === undefined) return "(not recorded)";
    return c.keys.join(", ") + (c.more ? " +" + c.more : "");
  }
  // Each changed key with its old → new digest, as its ConfigRollout says them (keyed
  // digests, short: they tell a change apart, never a value); none said: the names alone.
  function keyDigestsText(c) {
    if (!c.key_digests || !c.key_digests.length) return keysText(c);
    const by = new Map(c.key_digests.map((d) => [d.key, d]));
    const short = (d, none) => (d ? d.slice(0, 8) + "…" : none);
    const one = (k) => (by.has(k) ? k + ": " + short(by.get(k).old, "(added)") + " → " + short(by.get(k).new, "(removed)") : k);
    return (c.keys || c.key_digests.map((d) => d.key)).map(one).join(", ") + (c.more ? " +" + c.more : "");
  }
  async function changesView(r) {
    const doc = await get(withQuery("/api/changes", r));
    const rows = doc.changes.map((c) =>
      h(
        "tr",
        { class: "clickable", "data-change": c.id, onclick: () => go("change", [c.id]) },
        h("td", { class: "nowrap", title: when(c.at) }, ago(c.at)),
        h("td", {}, h("a", { href: "#/change/" + encodeURIComponent(c.id) }, source(c.source.kind, c.namespace, c.source.name)),
          c.shared ? h("span", { class: "quiet" }, " (shared: " + c.namespaces.join(", ") + ")") : null),
        h("td", { class: "mono" }, keysText(c)),
        h("td", {}, c.by),
        h("td", {}, progress(c.counts)),
        h("td", { "data-testid": "change-state" },
          c.moment ? badge(c.moment.state, c.moment.title)
          : c.waiting_approval ? badge("awaiting-approval", "awaiting approval")
          : c.current ? (c.verdict ? h("span", { class: "quiet" }, c.verdict.reason === "Delivered" ? "delivered" : "in progress") : h("span", { class: "quiet" }, "no verdict published"))
          : h("span", { class: "quiet" }, c.ended ? ["superseded; it ended ", badge(c.ended.state, c.ended.title)] : "superseded (how it ended is not recorded)"))
      )
    );
    return h(
      "section",
      {},
      h("h1", {}, "Recent changes"),
      h("div", { class: "toolbar" }, searchBox(r, "filter: source, user")),
      doc.changes.length
        ? h("table", { "data-testid": "changes" },
            h("thead", {}, h("tr", {}, ["When", "Source", "Keys changed", "By", "Rollouts", "State"].map((t) => h("th", {}, t)))),
            h("tbody", {}, rows))
        : h("p", { class: "quiet" }, "No change of a consumed ConfigMap or Secret is recorded here yet.")
    );
  }

  // --- one change: its waves as a timeline (as its ConfigRollout says them)
  function bar(row, begin, finish, now) {
    const width = 1000;
    const x = (t) => Math.max(0, Math.min(width, ((t - begin) / (finish - begin)) * width));
    const svg = s("svg", { viewBox: "0 0 " + width + " 18", preserveAspectRatio: "none" });
    svg.append(s("rect", { class: "track", x: 0, y: 3, width, height: 12 }));
    if (row.start !== null) {
      const end = row.end !== null ? row.end : now;
      const cls = row.state === "pending" || row.state === "checking" ? "waiting" : row.state;
      const x0 = x(row.start);
      const w = Math.max(4, x(end) - x0);
      const rect = s("rect", { class: "seg " + cls, x: x0, y: 3, width: w, height: 12 });
      const title = s("title", {});
      title.textContent =
        row.state + ": " + zoned(row.start) + (row.end !== null ? " to " + zoned(row.end) + " (" + duration(row.end - row.start) + ")" : " until now");
      rect.append(title);
      svg.append(rect);
    }
    svg.append(s("line", { class: "now", x1: x(now), x2: x(now), y1: 0, y2: 18 }));
    return svg;
  }
  function axis(begin, finish) {
    // the times in HTML (an SVG stretched to the column would stretch its text too)
    const labels = [];
    for (let i = 0; i <= 4; i++) labels.push(h("span", {}, clock(begin + ((finish - begin) * i) / 4)));
    return h("div", {}, h("div", { class: "ticks" }, labels), h("div", { class: "quiet" }, "times in " + zone()));
  }
  function legend() {
    const item = (cls, text) => {
      const svg = s("svg", { viewBox: "0 0 12 12" });
      svg.append(s("rect", { class: "seg " + cls, x: 0, y: 0, width: 12, height: 12 }));
      return h("span", {}, svg, text);
    };
    return h("div", { class: "legend" },
      item("rolling", "rolling"), item("complete", "complete"), item("waiting", "waiting"),
      item("failed", "failed"), item("left", "left"),
      h("span", {}, "bars run from the re-stamp to the end; the dashed line is now"));
  }
  // a button of a change: the CLI's verb (POST /api/VERB), with the user's own rights
  // a workload's pods by its own status: "2 of 3 updated · 1 ready" ("" when not known)
  function replicasText(r) {
    if (!r) return "";
    return r.updated + " of " + r.desired + " updated · " + r.ready + " ready";
  }

  // the source's earlier changes and how each ended (its ConfigRollout's history)
  function historyBox(c) {
    const title = "Earlier changes of " + source(c.source.kind, c.namespace, c.source.name);
    if (!c.history || !c.history.length) {
      return h("section", { "data-testid": "history" }, h("h2", {}, title),
        h("p", { class: "quiet" }, "None its ConfigRollout remembers: this is the first change configpin saw, or the ConfigRollout is new."));
    }
    const rows = c.history.map((e) => h("tr", {},
      h("td", {}, e.at ? new Date(e.at * 1000).toLocaleString("en-GB", { timeZoneName: "short" }) : h("span", { class: "quiet" }, "not said")),
      c.shared ? h("td", {}, e.namespace) : null,
      h("td", { class: "mono" }, e.content),
      h("td", {}, e.ended ? badge(e.ended.state, e.ended.title) : h("span", { class: "quiet" }, "not said"))));
    return h("section", { "data-testid": "history" }, h("h2", {}, title),
      h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, "moved on"), c.shared ? h("th", {}, "namespace") : null, h("th", {}, "content"), h("th", {}, "how it ended"))),
        h("tbody", {}, ...rows)));
  }

  const VERB_WORDS = { approve: "Approve", pause: "Pause", resume: "Resume", abort: "Abort", retry: "Retry" };
  async function press(c, verb, ns) {
    const answer = await post("/api/" + verb, { kind: c.source.kind, namespace: ns, name: c.source.name });
    const text = answer.ok ? answer.doc.message : answer.doc.error || "refused (" + answer.status + ")";
    messages[c.id] = { ok: answer.ok, verb, ns, text };
    if (answer.status === 403) refusals[c.source.kind + "/" + ns + "/" + c.source.name] = text;
    draw();
  }
  function buttonsBox(c) {
    const msg = messages[c.id];
    const all = c.buttons || [];
    if (!all.length && !msg) return null;
    const groups = all.map((b) => {
      const key = c.source.kind + "/" + b.namespace + "/" + c.source.name;
      // a refusal stands until the API server, asked again, says the user may
      if (b.may.allowed === true) delete refusals[key];
      const refused = refusals[key];
      const denied = refused || (b.may.allowed === false ? b.may.why : "");
      const reasonId = "why-" + key.replace(/[^a-z0-9]+/g, "-");
      const buttons = b.verbs.map((verb) =>
        h("button", {
          "data-testid": verb,
          "data-namespace": b.namespace,
          class: denied ? "denied" : null,
          "aria-disabled": denied ? "true" : null,
          "aria-describedby": denied ? reasonId : null,
          onclick: (ev) => {
            if (denied) return;
            ev.target.disabled = true;
            press(c, verb, b.namespace);
          },
        }, VERB_WORDS[verb] + " " + source(c.source.kind, b.namespace, c.source.name)));
      const mine = msg && msg.ns === b.namespace ? msg : null;
      let said = null;
      if (refused) {
        said = h("p", { id: reasonId, class: "message refused", "data-testid": (mine ? mine.verb : "press") + "-message" }, refused);
      } else if (denied) {
        said = h("p", { id: reasonId, class: "reason", "data-testid": "denied" }, "Greyed: " + denied + ".");
      } else if (mine) {
        said = h("p", { class: "message " + (mine.ok ? "ok" : "refused"), "data-testid": mine.verb + "-message" }, mine.text);
      } else if (b.may.allowed === null && b.may.why) {
        said = h("p", { class: "quiet" }, b.may.why);
      }
      return h("div", { class: "buttons", "data-buttons": b.namespace }, h("div", { class: "toolbar" }, buttons), said);
    });
    if (msg && !all.some((b) => b.namespace === msg.ns)) {
      // (its button no longer applies: the answer stays said)
      groups.push(h("p", { class: "message " + (msg.ok ? "ok" : "refused"), "data-testid": msg.verb + "-message" }, msg.text));
    }
    return h("div", { class: "actions", "data-testid": "actions" },
      h("p", { class: "quiet" }, "Each button does what its kubectl configpin command does, with your own rights (an update of the source): Approve releases the waves that wait for an approval of this content; Pause starts no further wave of it (rollouts already started are followed to the end); Resume goes on from where it stopped; Abort starts no further wave and, in snapshot mode, takes the workloads rolled to it back to the content before; Retry rolls content that failed, was rolled back or aborted again, from its first wave. A button your rights do not allow is greyed with the reason, as the API server answers before you press it."),
      groups);
  }
  function approvalBox(c) {
    const a = c.approval;
    if (!a.asked && !a.approved.length) return null;
    const done = a.approved.map((x) =>
      h("p", { "data-testid": "approved" }, (x.now ? "Approved --now in " : "Approved in ") + x.namespace + " by " + x.user + " " + ago(x.at) + " (as the source records it).")
    );
    return h(
      "div",
      { class: "approval" + (a.namespaces.length ? "" : " done") },
      a.namespaces.length
        ? h("p", {}, "Waves " + (a.after_wave !== null ? "after wave " + a.after_wave + " " : "") +
            "wait for an approval of this content. Approving is an update of the source: it needs your right to update it, as kubectl configpin approve does.")
        : null,
      done
    );
  }
  // a change that stopped (failed, rolled back, held, paused): as such, the signal, what to do
  function momentBox(c) {
    const m = c.moment;
    if (!m) return null;
    return h("div", { class: "moment " + m.state, "data-testid": "moment", "data-moment": m.state, role: "status" },
      h("h2", {}, badge(m.state, m.title), " This change " + m.words),
      m.message ? h("p", { "data-testid": "moment-message" }, plain(m.message)) : null,
      m.paused_by ? h("p", { "data-testid": "paused-by" }, "Paused by " + m.paused_by + (m.paused_at ? " at " + m.paused_at : "") + ".") : null,
      m.aborted_by ? h("p", { "data-testid": "aborted-by" }, "Aborted by " + m.aborted_by + (m.aborted_at ? " at " + m.aborted_at : "") + ".") : null,
      m.signal.length ? [h("p", {}, "What failed:"), h("ul", { "data-testid": "signal" }, m.signal.map((x) => h("li", {}, plain(x))))] : null,
      h("p", {}, "What you can do:"),
      h("ul", { "data-testid": "do" }, m.do.map((x) => h("li", {}, h("code", {}, x)))));
  }
  async function changeView(r) {
    const id = r.args[0] || "";
    const c = await get(withQuery("/api/change", r, { id }));
    const table = h("table", { class: "timeline", "data-testid": "timeline" });
    table.append(
      h("thead", {},
        h("tr", {}, h("th", {}, "Workload"), h("th", {}, "State"), h("th", {}, "Waits for / why"),
          h("th", { class: "axis" }, axis(c.begin, c.finish))))
    );
    const body = h("tbody", {});
    let wave = -1;
    for (const row of c.rows) {
      if (row.wave !== wave) {
        wave = row.wave;
        const members = c.rows.filter((x) => x.wave === wave);
        const done = members.filter((x) => x.state === "complete").length;
        const size = c.wave_sizes[wave - 1] !== undefined ? c.wave_sizes[wave - 1] : members.length;
        const gate = c.approval.after_wave !== null && wave > c.approval.after_wave ? " · after approve" : "";
        const title = wave === 0
          ? "No wave said · " + members.length + " workload" + (members.length === 1 ? "" : "s") +
            (members.length === c.total ? "" : " on this page")
          : "Wave " + wave + " of " + (c.waves || "?") + " · " + size + " workload" + (size === 1 ? "" : "s") +
            " · " + done + " complete" + gate;
        body.append(h("tr", { class: "wave", "data-wave": wave }, h("th", { colspan: 4 }, title)));
      }
      const waits = row.state === "waiting" ? row.waits : "";
      const until = row.state === "waiting" && row.until !== null ? "until " + zoned(row.until) : "";
      const took = row.start !== null
        ? (row.end !== null ? duration(row.end - row.start) : (row.state === "rolling" || row.state === "waiting" ? duration(c.now - row.start) + " so far" : ""))
        : "";
      const span = row.start !== null
        ? zoned(row.start) + (row.end !== null ? " to " + zoned(row.end) : "")
        : "";
      const pods = replicasText(row.replicas);
      body.append(
        h("tr", {
            "data-workload": row.namespace + "/" + row.kind + "/" + row.name,
            "data-row-wave": row.wave,
            "data-row-state": row.state,
          },
          h("td", {}, row.kind + " ", h("strong", {}, row.name), c.shared ? h("span", { class: "quiet" }, " " + row.namespace) : null),
          h("td", {}, row.state === "waiting" && row.waits_for === "Paused" ? badge("paused", "paused") : badge(row.state), took ? h("div", { class: "waits", "data-testid": "took" }, took) : null,
            span ? h("div", { class: "waits" }, span) : null,
            pods ? h("div", { class: "waits", "data-testid": "replicas" }, pods) : null),
          h("td", {},
            waits ? h("div", { "data-testid": "waits" }, waits + (until ? " (" + until + ")" : "")) : null,
            row.detail ? h("div", { class: "waits" }, plain(row.detail)) : null,
            row.pods && row.pods.length ? h("div", { class: "waits", "data-testid": "pods" }, "pods: " + row.pods.join(", ")) : null,
            !waits && !row.detail ? h("span", { class: "quiet" }, "nothing: configpin says nothing more of it") : null),
          h("td", { class: "bar" }, bar(row, c.begin, c.finish, c.now)))
      );
    }
    table.append(body);
    const counts = progress(c.counts);
    return h(
      "section",
      {},
      h("p", {}, h("a", { href: "#/changes" }, "‹ recent changes")),
      h("h1", {}, source(c.source.kind, c.namespace, c.source.name) + " changed by " + c.by + " " + ago(c.at)),
      h("div", { class: "chips" },
        h("span", { class: "chip mono", "data-testid": "keys",
          title: c.key_digests && c.key_digests.length ? "old → new digest of each key under configpin's key: never a value" : null },
          "keys: " + keyDigestsText(c)),
        h("span", { class: "chip mono", title: "a digest under configpin's key: the content, never a value" }, "content " + c.content),
        c.waves ? h("span", { class: "chip" }, c.waves + " wave" + (c.waves === 1 ? "" : "s") +
          (c.wave_sizes.length ? " (" + c.wave_sizes.join(", ") + ")" : "")) : null,
        c.verdict ? h("span", { class: "chip", "data-testid": "verdict", title: plain(c.verdict.message) }, c.verdict.condition + ": " + reasonWords(c.verdict.reason).toLowerCase()) : null,
        c.current ? null : h("span", { class: "chip" }, "superseded by a newer change")),
      counts,
      momentBox(c),
      c.rollout.said ? h("p", { class: "message refused", "data-testid": "rollout-said" }, plain(c.rollout.said)) : null,
      c.rollout.not_shown ? h("p", { class: "quiet" }, "Its ConfigRollout counts " + c.rollout.not_shown + " more members not done yet than it lists by name: those are shown as configpin status finds them, with no wave said.") : null,
      approvalBox(c),
      buttonsBox(c),
      c.rows.length ? legend() : null,
      c.rows.length ? table : h("p", { class: "quiet" }, "No workload rolls for this change."),
      pager(r, c),
      historyBox(c)
    );
  }

  // --- Used by
  async function sourcesView(r) {
    const doc = await get(withQuery("/api/sources", r));
    const rows = doc.sources.map((x) =>
      h("tr", { class: "clickable", "data-source": x.kind + "/" + x.namespace + "/" + x.name, onclick: () => go("source", [x.kind, x.namespace, x.name]) },
        h("td", {}, x.kind === "secret" ? "Secret" : "ConfigMap"),
        h("td", {}, x.namespace),
        h("td", {}, h("a", { href: "#/source/" + [x.kind, x.namespace, x.name].map(encodeURIComponent).join("/") }, x.name),
          x.missing ? h("span", {}, " ", badge("missing")) : null),
        h("td", {}, x.keys === null ? h("span", { class: "quiet" }, "not read") : String(x.keys)),
        h("td", {}, String(x.consumers)),
        h("td", {}, x.changed_by ? x.changed_by + " " + ago(x.changed_at) : h("span", { class: "quiet" }, "no change recorded")))
    );
    return h(
      "section", {},
      h("h1", {}, "Who uses which ConfigMap and Secret"),
      h("div", { class: "toolbar" }, searchBox(r, "filter: name, namespace")),
      h("table", { "data-testid": "sources" },
        h("thead", {}, h("tr", {}, ["Kind", "Namespace", "Name", "Keys", "Workloads", "Last change"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows)),
      pager(r, doc)
    );
  }
  function consumerRows(list) {
    return list.map((c) =>
      h("tr", { "data-consumer": c.kind + "/" + c.name },
        h("td", {}, c.kind + " ", h("strong", {}, c.name)),
        h("td", {}, c.how + (c.optional ? " (optional)" : "")),
        h("td", { class: "mono" }, c.where),
        h("td", {}, c.on_change),
        h("td", {}, c.on_failure))
    );
  }
  const SHOWN = 100; // readers of a key drawn at first (a source that thousands read)
  const expanded = new Set(); // the keys whose every reader is shown
  function consumerTable(list, key) {
    const all = expanded.has(key) || list.length <= SHOWN;
    const rows = consumerRows(all ? list : list.slice(0, SHOWN));
    if (!all) {
      rows.push(h("tr", {}, h("td", { colspan: 5 },
        h("button", { class: "plain", onclick: () => { expanded.add(key); draw(); } },
          "show all " + list.length + " (" + (list.length - SHOWN) + " more)"))));
    }
    return h("table", {},
      h("thead", {}, h("tr", {}, ["Workload", "How", "Where", "On change", "On failure"].map((t) => h("th", {}, t)))),
      h("tbody", {}, list.length ? rows : h("tr", {}, h("td", { colspan: 5, class: "quiet" }, "no workload reads it"))));
  }
  async function sourceView(r) {
    const [kind, ns, name] = r.args;
    const q = new URLSearchParams({ kind, namespace: ns, name });
    const doc = await get("/api/source?" + q.toString());
    const blocks = doc.keys.map((k) =>
      h("div", { class: "keyblock", "data-key": k.key },
        h("h2", { class: "mono" }, k.key, k.missing ? h("span", {}, " ", badge("missing")) : null,
          h("span", { class: "quiet" }, " · " + k.consumers.length + " workload" + (k.consumers.length === 1 ? "" : "s"))),
        consumerTable(k.consumers, kind + "/" + ns + "/" + name + "/" + k.key))
    );
    return h(
      "section", {},
      h("p", {}, h("a", { href: "#/sources" }, "‹ all sources")),
      h("h1", {}, source(kind, ns, name)),
      h("div", { class: "chips" },
        h("span", { class: "chip" }, doc.workloads + " workload" + (doc.workloads === 1 ? "" : "s") + " read it"),
        doc.changed_by ? h("span", { class: "chip" }, "last changed by " + doc.changed_by + " " + ago(doc.changed_at) +
          (doc.changed_keys ? " (keys " + doc.changed_keys.join(", ") + ")" : "")) : null,
        doc.found ? null : h("span", { class: "chip" }, "not found")),
      doc.keys_note ? h("p", { class: "quiet" }, doc.keys_note) : null,
      doc.every_key.length ? h("div", { class: "keyblock", "data-key": "*" }, h("h2", {}, "every key"), consumerTable(doc.every_key, kind + "/" + ns + "/" + name + "/*")) : null,
      blocks.length ? blocks : h("p", { class: "quiet" }, "No key known.")
    );
  }

  // --- Workloads
  async function workloadsView(r) {
    const doc = await get(withQuery("/api/workloads", r));
    const rows = doc.workloads.map((w) =>
      h("tr", { "data-workload": w.namespace + "/" + w.kind + "/" + w.name },
        oneNamespace ? null : h("td", {}, w.namespace),
        h("td", {}, w.kind + " ", h("strong", {}, w.name)),
        h("td", {}, badge(w.state), replicasText(w.replicas) ? h("div", { class: "waits" }, replicasText(w.replicas)) : null),
        h("td", { class: "waits" }, w.reason ? plain(w.reason) : h("span", { class: "quiet" }, "nothing to say: configpin reports no reason")),
        h("td", { class: "mono" }, w.sources.map((x) => h("div", {}, x.source + " ", h("span", { class: "quiet" }, x.state)))),
        h("td", { class: "mono" }, w.copies.map((x) => h("div", {}, x))),
        h("td", {},
          w.rollout ? h("div", {}, badge(w.rollout.state), " " + ago(w.rollout.since) + (w.rollout.by ? " · " + w.rollout.by.split(" at ")[0] : "")) : h("span", { class: "quiet" }, "no rollout recorded"),
          w.last.map((e) => h("div", { class: "waits", title: plain(e.note) }, reasonWords(e.reason) + " " + ago(e.at)))))
    );
    const checking = doc.workloads.filter((w) => w.checking).length;
    return h(
      "section", {},
      h("h1", {}, "Workloads, as configpin status reports them"),
      h("div", { class: "toolbar" }, searchBox(r, "filter: namespace, kind, name"),
        checking ? h("span", { class: "quiet" }, "asking the API server about " + checking + " (dry runs)…") : null),
      h("table", { "data-testid": "workloads" },
        h("thead", {}, h("tr", {}, [oneNamespace ? null : "Namespace", "Workload", "State", "Why", "Sources", "Copies in use", "Last rollouts"].filter((t) => t).map((t) => h("th", {}, t)))),
        h("tbody", {}, rows)),
      pager(r, doc)
    );
  }

  // --- Preview
  let previewText = "";
  let previewNs = "";
  let previewAnswer = null;
  function planTable(p) {
    const head = source(p.kind === "Secret" ? "secret" : "configmap", p.namespace, p.name);
    if (p.error) return h("div", { class: "message refused" }, head + ": " + p.error);
    if (p.new) return h("p", {}, head + ": new: created by the apply, nothing consumed it before");
    if (p.unknown) return h("p", {}, head + ": no plan: " + p.unknown);
    const keys = p.keys || [];
    if (!keys.length) return h("p", {}, head + ": no key changes: nothing rolls");
    const rows = (p.rows || []).map((x) =>
      h("tr", { "data-plan-row": x.namespace + "/" + x.kind + "/" + x.name },
        h("td", {}, x.namespace), h("td", {}, x.kind + "/" + x.name), h("td", { class: "mono" }, (x.keys || []).join(",") || "-"),
        h("td", {}, x.action), h("td", {}, x.wave === null ? "-" : String(x.wave)), h("td", { class: "waits" }, x.note || ""))
    );
    return h("div", { class: "keyblock", "data-plan": p.kind + "/" + p.namespace + "/" + p.name },
      h("h2", {}, head + ": keys " + keys.join(", ")),
      h("table", {},
        h("thead", {}, h("tr", {}, ["Namespace", "Workload", "Keys", "Action", "Wave", "Note"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 6, class: "quiet" }, "no workload consumes it")))),
      p.more ? h("p", { class: "quiet" }, "… and " + p.more + " more") : null);
  }
  async function runPreview() {
    const answer = await post("/api/preview", { manifest: previewText, namespace: previewNs });
    previewAnswer = answer;
    draw();
  }
  async function previewView() {
    const area = h("textarea", {
      id: "manifest",
      spellcheck: "false",
      "aria-label": "manifest to preview (YAML or JSON)",
      placeholder: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\ndata:\n  log-level: debug",
      oninput: (ev) => { previewText = ev.target.value; },
    });
    area.value = previewText;
    const file = h("input", {
      type: "file",
      accept: ".yaml,.yml,.json",
      "aria-label": "open a manifest file",
      onchange: (ev) => {
        const f = ev.target.files[0];
        if (!f) return;
        f.text().then((t) => { previewText = t; draw(); });
      },
    });
    const ns = h("input", { type: "text", id: "preview-ns", class: "wide", placeholder: "namespace (if the manifest names none)", "aria-label": "namespace (if the manifest names none)",
      value: previewNs, oninput: (ev) => { previewNs = ev.target.value; } });
    let result = null;
    if (previewAnswer) {
      result = previewAnswer.ok
        ? h("div", { "data-testid": "plans" }, previewAnswer.doc.plans.map(planTable))
        : h("p", { class: "message refused" }, previewAnswer.doc.error || "refused");
    }
    return h(
      "section", {},
      h("h1", {}, "Preview a change"),
      h("p", { class: "quiet" }, "Paste or open a ConfigMap or Secret manifest: configpin's admission answers a server-side dry run with what kubectl configpin plan lists. Nothing is changed, and the manifest is sent only to your API server."),
      area,
      h("div", { class: "toolbar" }, file, ns, h("button", { "data-testid": "preview", onclick: runPreview }, "Preview")),
      result
    );
  }

  const VIEWS = {
    changes: changesView,
    change: changeView,
    sources: sourcesView,
    source: sourceView,
    workloads: workloadsView,
    preview: previewView,
  };

  // --- live: the server says when the cluster moved; the view shown is read again
  const live = document.getElementById("live");
  function listen() {
    const stream = new EventSource("/api/stream");
    stream.addEventListener("version", (ev) => {
      live.className = "live on";
      live.textContent = "live";
      const v = Number(ev.data);
      if (v !== lastVersion) {
        lastVersion = v;
        if (current && current.name !== "preview") draw();
      }
    });
    stream.onerror = () => {
      live.className = "live off";
      live.textContent = "reconnecting";
    };
  }
  window.addEventListener("hashchange", () => {
    previewAnswer = current && current.name === "preview" ? previewAnswer : null;
    draw();
  });
  draw();
  listen();
  setInterval(() => {
    // times shown as "2m ago" move on; the data itself comes with the stream
    if (current && current.name !== "preview" && !loading) draw();
  }, 15000);
})();
