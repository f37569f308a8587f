// The page: wires the library, the reading options, the document view and asking together.

import { ApiError, call, part, serverKey, setServerKey } from "./api.js";
import { Asker } from "./ask.js";
import { Evaluator } from "./evaluate.js";
import { Library } from "./library.js";
import { ReadingOptions } from "./options.js";
import { DocumentView } from "./reader.js";
import { Writer } from "./write.js";

const $ = (id) => document.getElementById(id);

const view = new DocumentView($("doc"), $("doc-title"), $("doc-meta"));
const options = new ReadingOptions($("patterns"), $("options"), $("options-summary"), $("pattern-hint"));
const documents = new Map(); // "collection/source/indexed_at" -> the document with its text
let busy = false;

function showError(err) {
  if (err instanceof ApiError && err.status === 401) {
    askForKey(serverKey() ? `The server refused that key: ${err.message}`
      : "Sign in with a key (an admin makes one with marginalia keys create).");
    return;
  }
  const box = $("error");
  // a refusal says why: the server's message names what this key may not do, and what to ask for
  const refused = err instanceof ApiError && (err.status === 403 || err.status === 429);
  box.textContent = (refused ? "Refused: " : "") + (err.message || String(err));
  box.hidden = false;
}

function status(text) {
  $("status").textContent = text;
}

function askForKey(message) {
  const form = $("key-form");
  form.hidden = false;
  $("server").textContent = message;
  $("key").focus();
}

/** Show a document of a collection in the view (its text fetched once per indexing). */
async function openDocument(collection, source, section) {
  const info = library.detail && library.detail.name === collection
    ? library.detail.documents.find((d) => d.source === source) : null;
  const key = `${collection}/${source}/${info ? info.indexed_at : ""}`;
  let doc = documents.get(key);
  if (!doc) {
    doc = await call("GET", `/v1/collections/${part(collection)}/documents/${part(source)}`);
    documents.set(key, doc);
  }
  if (view.source !== doc.source || view.collection !== collection) {
    const pages = doc.page_starts.length ? `, ${doc.page_starts.length} pages` : "";
    view.show(doc.source, doc.text, doc.title || doc.source,
              `${doc.source} · ${doc.format}${pages} · ${doc.chunks} chunks`, doc.format);
    view.collection = collection;
  }
  if (section) view.scrollTo(section.start, section.end);
}

const library = new Library({
  collection: $("collection"), create: $("new-collection"), createName: $("new-collection-name"),
  createBox: $("new-collection-box"), upload: $("upload"), files: $("files"), jobs: $("jobs"),
  documents: $("documents"),
}, {
  collection: (detail) => {
    fillSources(detail);
    writer.collectionsChanged();
    evaluator.collectionChanged();
  },
  open: async (source, section) => {
    if (busy) {
      status("A reading is going: stop it (Escape) or wait before opening another document.");
      return;
    }
    try {
      await openDocument(library.name, source, section);
      $("source").value = `document:${source}`;
      sourceChanged();
    } catch (err) {
      showError(err);
    }
  },
  error: showError,
  status,
});

/** The source choices: each document of the collection, the whole collection, or a pasted text. */
function fillSources(detail) {
  const select = $("source");
  const before = select.value;
  const choices = [];
  if (detail && detail.documents.length) {
    const group = document.createElement("optgroup");
    group.label = `Collection ${detail.name}`;
    group.append(new Option(`the whole collection (${detail.documents.length} documents)`, "collection"));
    for (const doc of detail.documents) group.append(new Option(doc.source, `document:${doc.source}`));
    choices.push(group);
  }
  choices.push(new Option("a pasted text", "paste"));
  select.replaceChildren(...choices);
  const values = [...select.options].map((o) => o.value);
  const keep = values.includes(before) && (before !== "paste" || select.dataset.chosen);
  select.value = keep ? before : values.find((v) => v.startsWith("document:")) || values[0];
  sourceChanged();
}

function currentSource() {
  const value = $("source").value;
  if (value === "paste") return { kind: "paste" };
  if (value === "collection") return { kind: "collection", collection: library.name };
  return { kind: "document", collection: library.name, document: value.slice("document:".length) };
}

function sourceChanged() {
  const source = currentSource();
  $("paste-box").hidden = source.kind !== "paste";
  options.setCollection(source.kind === "collection");
  if (source.kind === "document" && !busy) {
    openDocument(source.collection, source.document).catch(showError);
  }
}

$("source").addEventListener("change", () => {
  $("source").dataset.chosen = "true"; // the reader's choice is kept when the documents change
  sourceChanged();
});

const asker = new Asker({
  form: $("ask"), question: $("question"), paste: $("paste"), ask: $("ask-button"), stop: $("stop-button"),
  status: $("status"), progress: $("progress"), error: $("error"), answerBox: $("answer-box"),
  answer: $("answer"), route: $("route"), cost: $("cost"), references: $("references"),
  referencesTitle: $("references-title"), marginList: $("margin-list"), collectionMargins: $("collection-margins"),
}, view, options, {
  source: currentSource,
  open: (collection, source) => openDocument(collection, source),
  error: showError,
  busy: (on) => {
    busy = on;
  },
});

const writer = new Writer({
  collection: $("write-collection"), options: $("write-options"), optionsSummary: $("write-options-summary"),
  editor: $("editor"), draft: $("draft"), mirror: $("mirror"), mirrorText: $("mirror-text"), ghost: $("ghost"),
  status: $("write-status"), live: $("write-live"), error: $("write-error"), memoryPanel: $("memory"),
  memoryMeta: $("memory-meta"), memoryItems: $("memory-items"),
}, {
  current: () => library.name,
  show: async (collection, source, start, end) => {
    if (busy) {
      writer.status("A reading is going in the Read view: stop it or wait before opening a source.");
      return;
    }
    try {
      showView("read");
      await openDocument(collection, source);
      if (library.name === collection) $("source").value = `document:${source}`;
      view.highlight(start, end);
    } catch (err) {
      showError(err);
    }
  },
});

const evaluator = new Evaluator({
  root: $("evaluate-view"), name: $("eval-collection"), generate: $("eval-generate"),
  generateProgress: $("eval-generate-progress"), status: $("eval-status"), counts: $("eval-counts"),
  pairs: $("eval-pairs"), doc: $("eval-doc"), docTitle: $("eval-doc-title"), docMeta: $("eval-doc-meta"),
  runForm: $("eval-run-form"), patterns: $("eval-patterns"), run: $("eval-run"), runHint: $("eval-run-hint"),
  runProgress: $("eval-run-progress"), results: $("eval-results"),
  recommendation: $("eval-recommendation"), table: $("eval-table"), plot: $("eval-plot"),
}, {
  collection: () => library.name,
  canWrite: (name) => library.canWrite(name),
  error: showError,
});

// -- the views: Read (ask a document or a collection), Write (suggestions from a collection) and Evaluate
// (questions generated from a collection, reviewed, and the readings run on them) ------------------------------

const VIEWS = {
  read: { tab: $("tab-read"), panel: $("read-view") },
  write: { tab: $("tab-write"), panel: $("write-view") },
  evaluate: { tab: $("tab-evaluate"), panel: $("evaluate-view") },
};
const ORDER = Object.keys(VIEWS);

function showView(name, focus = false) {
  for (const [other, { tab, panel }] of Object.entries(VIEWS)) {
    const on = other === name;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    panel.hidden = !on;
  }
  if (focus) VIEWS[name].tab.focus();
  if (name === "read") {
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  } else {
    history.replaceState(null, "", `#${name}`);
  }
  if (name === "write") writer.activate();
  else writer.deactivate();
  if (name === "evaluate") evaluator.activate();
  else evaluator.deactivate();
}

for (const [name, { tab }] of Object.entries(VIEWS)) {
  tab.addEventListener("click", () => showView(name));
  tab.addEventListener("keydown", (e) => { // arrows move between the tabs, as in any tab list
    if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
      e.preventDefault();
      const step = e.key === "ArrowRight" ? 1 : ORDER.length - 1;
      showView(ORDER[(ORDER.indexOf(name) + step) % ORDER.length], true);
    }
  });
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setServerKey($("key").value);
  $("key-form").hidden = true;
  start();
});

async function start() {
  try {
    const health = await call("GET", "/v1/health");
    const queue = health.queue || {}; // without the key, the server says only that it is up
    $("server").textContent = health.version === undefined ? "" : `model ${health.model || "loading"} · v${health.version}`
      + (queue.running || queue.waiting ? ` · ${queue.running} reading, ${queue.waiting} waiting` : "");
    const me = await call("GET", "/v1/me");
    library.setGrants(me);
    $("server").textContent += ` · ${signedIn(me)}`;
    $("server").dataset.signedIn = me.signed_in_as;
    await options.load();
    await library.load();
    const shown = location.hash.slice(1);
    if (shown in VIEWS && shown !== "read") showView(shown);
    document.body.dataset.ready = "true";
  } catch (err) {
    showError(err);
  }
}

/** Who the page is signed in as, and what that allows, in words. */
function signedIn(me) {
  if (me.kind === "anonymous") return "open server (no keys)";
  const who = me.kind === "user" ? `${me.name} (through the proxy)` : me.kind === "key" ? `key ${me.name}` : "the server key";
  if (me.admin) return `signed in as ${who}, admin`;
  const reads = me.read.filter((c) => !me.write.includes(c));
  const parts = [];
  if (me.write.length) parts.push(`writes ${me.write.join(", ")}`);
  if (reads.length) parts.push(`reads ${reads.join(", ")}`);
  return `signed in as ${who}: ${parts.join("; ") || "no collections"}`;
}

window.marginalia = { view, asker, library, options, writer, evaluator }; // for the console (and the page's tests)
start();
