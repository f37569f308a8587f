// The document view: a document's text exactly as the server read it (so character spans map one to one),
// cut into segment rows as a reading goes, each row with its margin beside it; and highlighted spans.

const HEADING = /^#{1,6}[ \t].*$/gm;

/** Append `text` to `el` as text nodes, with markdown heading lines in spans (the characters unchanged). */
function renderText(el, text) {
  let at = 0;
  for (const match of text.matchAll(HEADING)) {
    if (match.index > at) el.append(text.slice(at, match.index));
    const span = document.createElement("span");
    span.className = "heading";
    span.textContent = match[0];
    el.append(span);
    at = match.index + match[0].length;
  }
  if (at < text.length) el.append(text.slice(at));
}

function textCell(text, start) {
  const cell = document.createElement("div");
  cell.className = "text";
  cell.dataset.start = String(start);
  renderText(cell, text);
  return cell;
}

/** The text nodes of `cell`, each with its offset in the document. */
function textNodes(cell) {
  const out = [];
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  let at = Number(cell.dataset.start);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    out.push({ node, start: at });
    at += node.data.length;
  }
  return out;
}

export class DocumentView {
  constructor(root, title, meta) {
    this.root = root;
    this.title = title;
    this.meta = meta;
    this.text = "";
    this.source = null;
    this.clear();
  }

  clear() {
    this.root.replaceChildren();
    this.text = "";
    this.source = null;
    this.collection = null;
    this.rows = new Map();
    this.rest = null;
    this.cursor = 0;
    this.title.textContent = "Document";
    this.meta.textContent = "Pick a document, or paste a text, and ask a question.";
  }

  /** Show a document's text (a reading's rows start again). `source` names it for references. */
  show(source, text, title, meta) {
    this.source = source;
    this.collection = null;
    this.text = text;
    this.title.textContent = title || source;
    this.meta.textContent = meta || "";
    this.reset(false);
  }

  /** Back to the whole text in one piece; with `margins`, a column for them beside it. */
  reset(margins) {
    this.root.replaceChildren();
    this.rows = new Map();
    this.cursor = 0;
    this.root.classList.toggle("with-margins", Boolean(margins));
    this.rest = this.row(this.text, 0, null);
    this.rest.classList.add("rest");
    this.root.append(this.rest);
  }

  row(text, start, segment) {
    const row = document.createElement("div");
    row.className = "row";
    row.append(textCell(text, start));
    if (segment !== null) {
      row.dataset.segment = String(segment);
      const margin = document.createElement("aside");
      margin.className = "margin pending";
      margin.setAttribute("aria-label", `Margin of segment ${segment + 1}`);
      margin.textContent = "reading…";
      row.append(margin);
    }
    return row;
  }

  /** A segment was read: its text becomes a row of its own, with a margin waiting beside it. */
  segment(index, start, end) {
    const from = Math.min(this.cursor, start);
    if (end <= from || !this.rest) return;
    const row = this.row(this.text.slice(from, end), from, index);
    row.classList.add("current");
    for (const other of this.rows.values()) other.classList.remove("current");
    this.rows.set(index, row);
    this.rest.before(row);
    this.cursor = end;
    const left = this.text.slice(end);
    const cell = textCell(left, end);
    this.rest.firstChild.replaceWith(cell);
    this.rest.hidden = !left;
  }

  margin(index) {
    const row = this.rows.get(index);
    return row ? row.querySelector(".margin") : null;
  }

  /** A margin was written for a segment (not judged yet). */
  written(index, text) {
    const el = this.margin(index);
    if (!el) return;
    el.className = "margin written";
    el.replaceChildren(marginText(text));
  }

  /** A margin was judged: kept ones are marked, dropped ones say why. */
  judged(margin) {
    const el = this.margin(margin.segment_index);
    if (!el) return;
    fillMargin(el, margin);
    this.rows.get(margin.segment_index).classList.remove("current");
  }

  /** Mark a reading as over: a row still waiting for its margin says it got none. */
  finish() {
    for (const row of this.rows.values()) {
      row.classList.remove("current");
      const el = row.querySelector(".margin.pending");
      if (el) el.textContent = "no margin";
    }
  }

  /** Wrap the characters [start, end) in marks of `cls`; returns the marks. */
  mark(start, end, cls) {
    const marks = [];
    for (const cell of this.root.querySelectorAll(".text")) {
      for (const { node, start: at } of textNodes(cell)) {
        const to = at + node.data.length;
        if (to <= start || at >= end || !node.data.length) continue;
        let target = node;
        if (start > at) target = target.splitText(start - at);
        if (end < to) target.splitText(end - Math.max(start, at));
        const mark = document.createElement("mark");
        mark.className = cls;
        target.replaceWith(mark);
        mark.append(target);
        marks.push(mark);
      }
    }
    return marks;
  }

  unmark(cls) {
    for (const mark of this.root.querySelectorAll(`mark.${cls}`)) {
      const parent = mark.parentNode;
      mark.replaceWith(...mark.childNodes);
      parent.normalize();
    }
  }

  /** Highlight a reference's span and bring it into view; returns the highlighted text. */
  highlight(start, end) {
    this.unmark("hl");
    const marks = this.mark(start, end, "hl");
    if (marks.length) {
      marks[0].id = "highlight";
      marks[0].scrollIntoView({ block: "center", behavior: smooth() });
    }
    return marks.map((m) => m.textContent).join("");
  }

  /** Scroll to a character offset (a section's heading), briefly flagging the spot. */
  scrollTo(start, end) {
    this.unmark("spot");
    const marks = this.mark(start, Math.min(end, start + 400), "spot");
    if (marks.length) marks[0].scrollIntoView({ block: "start", behavior: smooth() });
    setTimeout(() => this.unmark("spot"), 1500);
  }
}

function smooth() {
  return window.matchMedia("(prefers-reduced-motion: reduce)").matches ? "auto" : "smooth";
}

function marginText(text) {
  const p = document.createElement("p");
  p.className = "margin-text";
  p.textContent = text || "(empty margin)";
  return p;
}

/** Fill a margin element from a judged margin (also used by the list of a collection's margins). */
export function fillMargin(el, margin) {
  el.className = `margin ${margin.relevant ? "kept" : "dropped"}`;
  const verdict = document.createElement("p");
  verdict.className = "verdict";
  const score = typeof margin.score === "number" ? ` · ${margin.score.toFixed(2)}` : "";
  verdict.textContent = (margin.relevant ? "kept" : "dropped") + score;
  const parts = [verdict, marginText(margin.text)];
  if (!margin.relevant && margin.reason) {
    const reason = document.createElement("p");
    reason.className = "reason";
    reason.textContent = margin.reason;
    parts.push(reason);
  }
  el.replaceChildren(...parts);
}
