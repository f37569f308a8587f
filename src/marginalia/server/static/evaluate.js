// The Evaluate view: questions generated from the selected collection's documents (a job, its pairs arriving
// as they are written), reviewed one by one (accept, edit, reject) beside their evidence in the document, then
// the chosen readings run on the accepted ones (a job), with a table of scores and seconds per answer and a plot
// of one against the other. A key that may only read the collection sees the pairs and the results, no buttons.

import { call, part, stream } from "./api.js";
import { DocumentView } from "./reader.js";

/** seconds between looks at a running evaluation job */
const POLL_MS = 300;
const KINDS = { single: "fact", join: "two sections", document: "whole document", unanswerable: "unanswerable" };
/** the plot's size (its viewBox) and margins, in its own units */
const PLOT = { width: 520, height: 300, left: 48, right: 16, top: 14, bottom: 42 };

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** An element of the plot's SVG (`ns`: the namespace of the page's own <svg> element). */
function svg(ns, tag, attrs, text) {
  const node = document.createElementNS(ns, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, cls, onClick) {
  const b = el("button", cls, label);
  b.type = "button";
  b.addEventListener("click", (e) => {
    e.stopPropagation();
    onClick();
  });
  return b;
}

const fixed = (x, digits = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));

export class Evaluator {
  /**
   * @param {object} els the view's elements
   * @param {object} on `collection()`: the selected collection's name; `canWrite(name)`; `error(err)`
   */
  constructor(els, on) {
    this.els = els;
    this.on = on;
    this.view = new DocumentView(els.doc, els.docTitle, els.docMeta);
    this.view.title.textContent = "Evidence";
    this.view.meta.textContent = "Pick a question to see its evidence in its document.";
    this.collection = null;
    this.pairs = [];
    this.generating = null; // the question job writing pairs, if any
    this.patterns = null;
    this.documents = new Map(); // "collection/source" -> the document with its text
    this.selected = null;
    this.active = false;
    els.generate.addEventListener("click", () => this.generate());
    els.runForm.addEventListener("submit", (e) => {
      e.preventDefault();
      this.run();
    });
  }

  /** The view is shown: (re)load what belongs to the selected collection. */
  async activate() {
    this.active = true;
    try {
      if (!this.patterns) await this.loadPatterns();
      if (this.collection !== this.on.collection()) await this.load();
    } catch (err) {
      this.on.error(err);
    }
  }

  deactivate() {
    this.active = false;
  }

  /** The library's collection changed: the view follows it (now if shown, else when shown). */
  collectionChanged() {
    if (this.active) this.activate();
  }

  status(text) {
    this.els.status.textContent = text;
  }

  writable() {
    return this.collection !== null && this.on.canWrite(this.collection);
  }

  async loadPatterns() {
    const schema = await call("GET", "/v1/patterns"); // the registry's patterns, as options.js reads them
    this.patterns = schema.properties.reading.oneOf.map((reading) => reading.title);
    const boxes = this.patterns.map((name) => {
      const label = el("label", "check");
      const input = document.createElement("input");
      input.type = "checkbox";
      input.name = "pattern";
      input.value = name;
      input.id = `eval-pattern-${name}`;
      input.checked = name !== "lc";
      label.append(input, ` ${name}`);
      return label;
    });
    this.els.patterns.replaceChildren(...boxes);
  }

  async load() {
    const name = this.on.collection();
    this.collection = name;
    this.els.name.textContent = name || "";
    this.els.results.hidden = true;
    this.view.clear();
    this.view.title.textContent = "Evidence";
    this.view.meta.textContent = "Pick a question to see its evidence in its document.";
    this.selected = null;
    const write = this.writable();
    this.els.generate.hidden = !write;
    this.els.runForm.hidden = !write;
    if (!name) {
      this.pairs = [];
      this.render();
      this.status("Pick or create a collection first.");
      return;
    }
    const listed = await call("GET", `/v1/collections/${part(name)}/qa-pairs`);
    if (this.collection !== name) return; // another collection was picked meanwhile
    this.pairs = listed.pairs;
    this.render();
    this.status(this.pairs.length ? "" : "No questions yet: generate some from the collection's documents.");
    if (listed.generating && !this.generating) this.follow(listed.generating);
  }

  // -- generating ---------------------------------------------------------------------------------------------

  async generate() {
    const name = this.collection;
    try {
      const job = await call("POST", `/v1/collections/${part(name)}/qa-jobs`, {});
      await this.follow(job.id);
    } catch (err) {
      this.on.error(err);
    }
  }

  /** Follow a question job: its progress, and each pair as it is written. */
  async follow(jobId) {
    const name = this.collection;
    const bar = this.els.generateProgress;
    this.generating = jobId;
    this.els.root.dataset.generating = "true";
    this.els.generate.disabled = true;
    bar.hidden = false;
    bar.removeAttribute("value");
    this.status("Generating questions…");
    this.render();
    try {
      const { events } = await stream("GET", `/v1/qa-jobs/${part(jobId)}/events`);
      let done = 0;
      let total = 0;
      for await (const { event, data } of events) {
        if (event === "document") {
          total += data.total;
          done += data.done_before;
          this.status(`Reading ${data.source}: ${data.sections} sections, ${data.total} requests planned.`);
        } else if (event === "request") {
          done += 1;
          bar.max = Math.max(total, 1);
          bar.value = done;
        } else if (event === "pair" && this.collection === name) {
          this.pairs.push(data.pair);
          this.render();
        } else if (event === "done") {
          const made = data.result ? data.result.new_pairs : data.pairs_made;
          this.status(`Generated ${made} new question${made === 1 ? "" : "s"}: review them below.`);
        } else if (event === "failed") {
          this.status(`Generating failed: ${data.error ? data.error.message : "see the server's log"}`);
        }
      }
    } catch (err) {
      this.on.error(err);
    } finally {
      this.generating = null;
      delete this.els.root.dataset.generating;
      this.els.generate.disabled = false;
      bar.hidden = true;
      if (this.collection === name) this.render();
    }
  }

  // -- reviewing ----------------------------------------------------------------------------------------------

  counts() {
    const out = { pending: 0, accepted: 0, rejected: 0 };
    for (const p of this.pairs) out[p.status] = (out[p.status] || 0) + 1;
    return out;
  }

  render() {
    const c = this.counts();
    this.els.counts.textContent = this.pairs.length
      ? `${c.accepted} accepted · ${c.rejected} rejected · ${c.pending} to review` : "";
    this.els.pairs.replaceChildren(...this.pairs.map((pair) => this.item(pair)));
    this.els.run.disabled = c.accepted === 0;
    this.els.runHint.textContent = c.accepted ? `on ${c.accepted} accepted question${c.accepted === 1 ? "" : "s"}`
      : "accept some questions first";
  }

  item(pair) {
    const li = el("li", "pair");
    li.dataset.id = pair.id;
    li.dataset.status = pair.status;
    li.dataset.kind = pair.kind || "single";
    if (this.selected === pair.id) li.classList.add("selected");
    const head = el("div", "pair-head");
    head.append(el("span", "pair-kind", KINDS[pair.kind] || pair.kind || "fact"),
                el("span", "pair-state", pair.status + (pair.edited ? " · edited" : "")));
    const show = el("button", "pair-open");
    show.type = "button";
    show.append(el("span", "pair-question", pair.question),
                el("span", "pair-answer", pair.kind === "unanswerable" ? "(not answered by the document)" : pair.answer),
                el("span", "pair-place", [pair.source, ...(pair.section_path || [])].join(" › ")));
    show.addEventListener("click", () => this.select(pair));
    li.append(head, show);
    if (this.writable()) li.append(this.actions(pair, li));
    return li;
  }

  actions(pair, li) {
    const row = el("div", "pair-actions");
    const busy = this.generating !== null; // the server refuses a review while a job writes the file
    const accept = button("Accept", "accept", () => this.review(pair, { status: "accepted" }));
    const edit = button("Edit", "edit", () => this.edit(pair, li));
    const reject = button("Reject", "reject", () => this.review(pair, { status: "rejected" }));
    for (const b of [accept, edit, reject]) b.disabled = busy;
    accept.setAttribute("aria-label", `Accept: ${pair.question}`);
    reject.setAttribute("aria-label", `Reject: ${pair.question}`);
    edit.setAttribute("aria-label", `Edit: ${pair.question}`);
    row.append(accept, edit, reject);
    return row;
  }

  /** Replace the pair's text with a form for a new question and answer (saved: accepted). */
  edit(pair, li) {
    const form = el("form", "pair-edit");
    const q = document.createElement("input");
    q.value = pair.question;
    q.required = true;
    q.id = `edit-q-${pair.id}`;
    const a = document.createElement("input");
    a.value = pair.answer;
    a.id = `edit-a-${pair.id}`;
    a.required = pair.kind !== "unanswerable";
    const lq = el("label", null, "Question");
    lq.htmlFor = q.id;
    const la = el("label", null, "Answer");
    la.htmlFor = a.id;
    const save = el("button", "primary", "Save and accept");
    save.type = "submit";
    const cancel = button("Cancel", null, () => this.render());
    form.append(lq, q, la, a, save, cancel);
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const change = { status: "accepted", question: q.value.trim() };
      if (a.value.trim()) change.answer = a.value.trim();
      this.review(pair, change);
    });
    li.querySelector(".pair-actions").replaceWith(form);
    q.focus();
  }

  async review(pair, change) {
    try {
      const stored = await call("PATCH", `/v1/collections/${part(this.collection)}/qa-pairs/${part(pair.id)}`, change);
      const at = this.pairs.findIndex((p) => p.id === pair.id);
      if (at >= 0) this.pairs[at] = stored;
      this.render();
      const next = this.els.pairs.querySelector(`li[data-id="${CSS.escape(pair.id)}"] .pair-open`);
      if (next) next.focus();
    } catch (err) {
      this.on.error(err);
    }
  }

  /** Show a pair's evidence, each of its spans highlighted, in its document. */
  async select(pair) {
    this.selected = pair.id;
    for (const li of this.els.pairs.children) li.classList.toggle("selected", li.dataset.id === pair.id);
    try {
      const key = `${this.collection}/${pair.source}`;
      let doc = this.documents.get(key);
      if (!doc) {
        doc = await call("GET", `/v1/collections/${part(this.collection)}/documents/${part(pair.source)}`);
        this.documents.set(key, doc);
      }
      if (this.view.source !== doc.source) this.view.show(doc.source, doc.text, doc.title || doc.source, "", doc.format);
      this.view.unmark("hl");
      const spans = (pair.evidence_spans || []).filter((s) => s.source === doc.source);
      const marks = spans.flatMap((s) => this.view.mark(s.start, s.end, "hl"));
      this.view.meta.textContent = spans.length
        ? `${doc.source} · ${spans.length === 1 ? "the evidence" : `${spans.length} pieces of evidence`} highlighted`
        : `${doc.source} · no evidence: the document should not answer this question`;
      if (marks.length) {
        marks[0].id = "eval-highlight";
        marks[0].scrollIntoView({ block: "center" });
      }
    } catch (err) {
      this.on.error(err);
    }
  }

  // -- running the readings -----------------------------------------------------------------------------------

  async run() {
    const patterns = [...this.els.patterns.querySelectorAll("input:checked")].map((i) => i.value);
    if (!patterns.length) {
      this.status("Choose at least one reading to run.");
      return;
    }
    const name = this.collection;
    const bar = this.els.runProgress;
    this.els.run.disabled = true;
    this.els.results.dataset.state = "running";
    try {
      let job = await call("POST", `/v1/collections/${part(name)}/eval-jobs`, { patterns });
      bar.hidden = false;
      this.status(`Running ${patterns.join(", ")} on ${job.pairs} accepted questions…`);
      while (!["done", "failed"].includes(job.status)) {
        bar.max = Math.max(job.answers_total, 1);
        bar.value = job.answers_done;
        this.results(job);
        await new Promise((resolve) => setTimeout(resolve, POLL_MS));
        job = await call("GET", `/v1/eval-jobs/${part(job.id)}`);
      }
      this.results(job);
      this.els.results.dataset.state = job.status;
      this.status(job.status === "done" ? `Scored ${job.answers_total} answers.`
        : `The run failed: ${job.error ? job.error.message : "see the server's log"}`);
    } catch (err) {
      delete this.els.results.dataset.state;
      this.on.error(err);
    } finally {
      bar.hidden = true;
      this.els.run.disabled = this.counts().accepted === 0;
    }
  }

  /** The recommendation (a line per kind of question), the results table (a row per reading) and the plot,
   * from a job's state. */
  results(job) {
    this.els.results.hidden = false;
    this.els.recommendation.replaceChildren(...(job.recommendations || []).map((r) => {
      const li = el("li", null, r.text);
      li.dataset.kind = r.kind;
      li.dataset.reading = r.reading;
      return li;
    }));
    const rows = job.readings.map((r) => {
      const tr = el("tr");
      tr.dataset.pattern = r.pattern;
      const f1 = r.f1 ? `${fixed(r.f1.mean)} [${fixed(r.f1.low)}, ${fixed(r.f1.high)}]` : "–";
      const state = r.status === "failed" ? `failed: ${r.error ? r.error.message : ""}`
        : r.status === "done" ? `${r.n}` : `${r.n} of ${job.pairs}`;
      tr.append(el("th", null, r.pattern), el("td", "score", f1), el("td", null, r.contains ? fixed(r.contains.mean) : "–"),
                el("td", "seconds", fixed(r.seconds_per_answer)), el("td", null, state));
      tr.firstChild.scope = "row";
      return tr;
    });
    this.els.table.tBodies[0].replaceChildren(...rows);
    this.plot(job.readings.filter((r) => r.f1 && r.seconds_per_answer !== null));
  }

  /** Score (F1) against seconds per answer: a point per reading, its 95% interval as a vertical bar. */
  plot(readings) {
    const p = PLOT;
    const chart = this.els.plot;
    const make = (tag, attrs, text) => svg(chart.namespaceURI, tag, attrs, text);
    chart.setAttribute("viewBox", `0 0 ${p.width} ${p.height}`);
    const maxX = Math.max(...readings.map((r) => r.seconds_per_answer), 1e-3) * 1.15;
    const x = (s) => p.left + (s / maxX) * (p.width - p.left - p.right);
    const y = (v) => p.top + (1 - v) * (p.height - p.top - p.bottom);
    const parts = [
      make("line", { x1: p.left, y1: y(0), x2: p.width - p.right, y2: y(0), class: "axis" }),
      make("line", { x1: p.left, y1: y(0), x2: p.left, y2: y(1), class: "axis" }),
      make("text", { x: (p.left + p.width - p.right) / 2, y: p.height - 6, class: "axis-label",
                    "text-anchor": "middle" }, "seconds per answer"),
      make("text", { x: 12, y: y(0.5), class: "axis-label", "text-anchor": "middle",
                    transform: `rotate(-90 12 ${y(0.5)})` }, "F1"),
    ];
    for (const v of [0, 0.5, 1]) {
      parts.push(make("text", { x: p.left - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, v.toFixed(1)));
    }
    for (const s of [0, maxX / 2, maxX]) {
      parts.push(make("text", { x: x(s), y: y(0) + 16, class: "tick", "text-anchor": "middle" }, s.toPrecision(2)));
    }
    for (const r of readings) {
      const g = make("g", { class: "reading", "data-pattern": r.pattern });
      const cx = x(r.seconds_per_answer);
      g.append(make("line", { x1: cx, y1: y(r.f1.low), x2: cx, y2: y(r.f1.high), class: "interval" }),
               make("circle", { cx, cy: y(r.f1.mean), r: 5, class: "point" }),
               make("text", { x: cx + 8, y: y(r.f1.mean) - 6, class: "point-label" }, r.pattern),
               make("title", {}, `${r.pattern}: F1 ${fixed(r.f1.mean)} [${fixed(r.f1.low)}, ${fixed(r.f1.high)}], `
                 + `${fixed(r.seconds_per_answer)} s per answer`));
      parts.push(g);
    }
    chart.replaceChildren(...parts);
  }
}
