// The document view: a document's text as the server read it, rendered (headings, emphasis, lists, tables: see
// markdown.js) with every character on the page still at its offset in that text, so a character span highlights
// exactly what it covers; cut into segment rows as a reading goes, each row with its margin beside it.

import { parse } from "./markdown.js";

/** Each rendered text node's offset in the document's text (its characters are the text's, from there). */
const START = new WeakMap();
const INLINE = { strong: "strong", em: "em", code: "code", del: "del", link: "span" };

function piece(text, start, end) {
  const node = document.createTextNode(text.slice(start, end));
  START.set(node, start);
  return node;
}

/** Append the part of `runs` that lies in [a, b) to `el`, each run in the elements of its styles. */
function appendRuns(el, text, runs, a, b) {
  let shown = false;
  for (const run of runs) {
    if (run.br) {
      if (a <= run.start && run.start < b) el.append(document.createElement("br"));
      continue;
    }
    const from = Math.max(run.start, a);
    const to = Math.min(run.end, b);
    if (to <= from) continue;
    let node = piece(text, from, to);
    for (const mark of [...run.marks].reverse()) {
      const wrap = document.createElement(INLINE[mark] || "span");
      if (mark === "link") wrap.className = "link";
      wrap.append(node);
      node = wrap;
    }
    el.append(node);
    shown = true;
  }
  return shown;
}

/** The characters [start, end) of the text that an element rendered at the top of a cell stands for. */
const SPAN = new WeakMap();

/** Render the blocks of a parsed text that lie in [a, b) into `el` (a block cut by a bound shows its part). */
function renderBlocks(el, text, blocks, a, b) {
  let lo = 0;
  let hi = blocks.length;
  while (lo < hi) { // the first block that ends after a (blocks are in order and do not overlap)
    const mid = (lo + hi) >> 1;
    if (blocks[mid].end <= a) lo = mid + 1;
    else hi = mid;
  }
  let list = null;
  const add = (node, block) => {
    el.append(node);
    SPAN.set(node, [block.start, block.end]);
  };
  for (let i = lo; i < blocks.length && blocks[i].start < b; i++) {
    const block = blocks[i];
    if (block.tag === "hr") {
      if (block.start >= a) add(document.createElement("hr"), block);
      list = null;
      continue;
    }
    if (block.tag === "table") {
      const table = document.createElement("table");
      for (const row of block.rows) {
        const tr = document.createElement("tr");
        let shown = false;
        for (const cell of row.cells) {
          const td = document.createElement(row.header ? "th" : "td");
          shown = appendRuns(td, text, cell, a, b) || shown;
          tr.append(td);
        }
        if (shown) table.append(tr);
      }
      if (table.rows.length) add(table, block);
      list = null;
      continue;
    }
    const node = document.createElement(block.tag);
    if (!appendRuns(node, text, block.runs, a, b)) continue;
    if (block.tag !== "li") {
      add(node, block);
      list = null;
      continue;
    }
    if (!list || list.tagName.toLowerCase() !== block.list) {
      list = document.createElement(block.list);
      add(list, block);
    }
    SPAN.get(list)[1] = block.end;
    if (block.number !== undefined) node.value = block.number;
    if (block.depth) node.style.marginLeft = `${1.5 * block.depth}em`;
    list.append(node);
  }
}

/** Render markdown as phrasing content (a reference's quote in a button): blocks one after another, headings
 * in bold. */
export function renderInline(el, text) {
  const parts = []; // each block's runs; a table's, cell by cell
  for (const block of parse(text)) {
    if (block.tag === "table") parts.push(...block.rows.flatMap((row) => row.cells.map((runs) => ({ runs }))));
    else parts.push({ runs: block.runs, heading: /^h\d$/.test(block.tag) });
  }
  parts.forEach(({ runs, heading }, i) => {
    if (i) el.append(" ");
    const into = heading ? document.createElement("strong") : el;
    appendRuns(into, text, runs, 0, text.length);
    if (heading) el.append(into);
  });
}

/** Split a rendered text node at `k`, keeping both parts' offsets; returns the second part. */
function split(node, k) {
  const rest = node.splitText(k);
  START.set(rest, START.get(node) + k);
  return rest;
}

/** The rendered text nodes under `root`, in order. */
function textNodes(root) {
  const out = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (START.has(node)) out.push(node);
  }
  return out;
}

export class DocumentView {
  constructor(root, title, meta) {
    this.root = root;
    this.title = title;
    this.meta = meta;
    this.text = "";
    this.blocks = null;
    this.source = null;
    this.clear();
  }

  clear() {
    this.root.replaceChildren();
    this.text = "";
    this.blocks = null;
    this.source = null;
    this.collection = null;
    this.rows = new Map();
    this.rest = null;
    this.cursor = 0;
    this.title.textContent = "Document";
    this.meta.textContent = "Pick a document, or paste a text, and ask a question.";
  }

  /** Show a document's text (a reading's rows start again). `source` names it for references; a `format` of
   * "text" (plain text) is shown as it is, any other is rendered as the markdown it was stored as. */
  show(source, text, title, meta, format = "markdown") {
    this.source = source;
    this.collection = null;
    this.text = text;
    this.blocks = format === "text" ? null : parse(text);
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
    this.rest = this.row(0, this.text.length, null);
    this.rest.classList.add("rest");
    this.root.append(this.rest);
  }

  /** The characters [a, b) of the text, rendered. */
  cell(a, b) {
    const cell = document.createElement("div");
    cell.className = "text";
    if (this.blocks) {
      cell.classList.add("md");
      renderBlocks(cell, this.text, this.blocks, a, b);
    } else {
      cell.append(piece(this.text, a, b));
    }
    return cell;
  }

  row(a, b, segment) {
    const row = document.createElement("div");
    row.className = "row";
    row.append(this.cell(a, b));
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
    const row = this.row(from, end, index);
    row.classList.add("current");
    for (const other of this.rows.values()) other.classList.remove("current");
    this.rows.set(index, row);
    this.rest.before(row);
    this.cursor = end;
    this.trimRest(end);
    this.rest.hidden = !this.text.slice(end);
  }

  /** Take out of the rest of the text what now has a row of its own: everything before `end`. Only the block
   * that `end` cuts is rendered again (a long document is read in many segments). */
  trimRest(end) {
    const cell = this.rest.firstChild;
    if (!this.blocks) {
      cell.replaceWith(this.cell(end, this.text.length));
      return;
    }
    while (cell.firstChild) {
      const child = cell.firstChild;
      const [a, b] = SPAN.get(child);
      if (b <= end) {
        child.remove();
        continue;
      }
      if (a < end) {
        const part = document.createDocumentFragment();
        renderBlocks(part, this.text, this.blocks, end, b);
        child.replaceWith(part);
      }
      break;
    }
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

  /** Wrap the characters [start, end) in marks of `cls` (what of them is shown: markup is not); returns the
   * marks. */
  mark(start, end, cls) {
    const marks = [];
    for (const node of textNodes(this.root)) {
      const at = START.get(node);
      const to = at + node.data.length;
      if (to <= start || at >= end || !node.data.length) continue;
      let target = node;
      if (start > at) target = split(target, start - at);
      if (end < to) split(target, end - Math.max(start, at));
      const mark = document.createElement("mark");
      mark.className = cls;
      target.replaceWith(mark);
      mark.append(target);
      marks.push(mark);
    }
    return marks;
  }

  unmark(cls) {
    // no normalize(): two neighbouring text nodes may stand for characters apart (markup between them)
    for (const mark of this.root.querySelectorAll(`mark.${cls}`)) mark.replaceWith(...mark.childNodes);
  }

  /** The rendered text node by node: its offset in the text, its characters and the classes of the marks it is
   * in (what highlighting relies on; the tests read it). */
  pieces() {
    return textNodes(this.root).map((node) => ({
      start: START.get(node),
      text: node.data,
      marks: [...this.marksAround(node)],
    }));
  }

  *marksAround(node) {
    for (let el = node.parentElement; el && el !== this.root; el = el.parentElement) {
      if (el.tagName === "MARK") yield el.className;
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
