// Asking: the question's source and options become one streamed POST /v1/ask; its events fill the document
// view (a row per segment, its margin beside it), the status line and the answer. Stop asks the server to stop
// that reading (POST /v1/readings/{id}/stop): it finishes the step in progress and answers from what was read.
// Auto reads with rag, then with wim where rag's answer does not stand: its `routed` event says which and why,
// and each reading's `started` says which pattern the events that follow come from.

import { ApiError, call, part, stream } from "./api.js";
import { fillMargin, renderInline } from "./reader.js";

const READING_HEADER = "Marginalia-Reading-Id";
const number = new Intl.NumberFormat("en");

/** Where a reference points, as one line: document › section path · page. */
export function referencePlace(ref) {
  const parts = [ref.source, ...ref.section_path].filter(Boolean);
  return parts.join(" › ") + (ref.page ? ` · p. ${ref.page}` : "");
}

/** The route line of an auto answer: the reading that answered, and why. */
export function routeLine(route) {
  const taken = { wim: "WiM", lc: "long context" }[route.taken] || "RAG";
  return { taken: `Answered by ${taken}`, reason: `: ${route.reason}.` };
}

/** The cost line of an answer's stats: tokens read (and from cache), generated, seconds. A model server that
 * did not say what it took from its prompt cache leaves the tokens read unknown (null), not zero. */
export function costLine(stats) {
  const generated = stats.generated_margin_tokens + stats.generated_answer_tokens + stats.generated_other_tokens;
  const cached = stats.cached_context_tokens ? ` (${number.format(stats.cached_context_tokens)} from cache)` : "";
  const read = stats.prefilled_context_tokens === null
    ? `Tokens read not reported by the model server${cached}`
    : `Read ${number.format(stats.prefilled_context_tokens + stats.cached_context_tokens)} tokens${cached}`;
  return `${read} · generated ${number.format(generated)} · ${stats.total_seconds.toFixed(1)} s`;
}

export class Asker {
  /**
   * @param {object} els the form's and the answer's elements
   * @param {DocumentView} view the document view
   * @param {ReadingOptions} options the reading options
   * @param {object} on `source()` -> {kind, collection, document}, `open(collection, source)` -> shows a
   *   document in the view (resolves when shown), `error(err)`, `busy(reading)`
   */
  constructor(els, view, options, on) {
    this.els = els;
    this.view = view;
    this.options = options;
    this.on = on;
    this.readingId = null;
    this.controller = null;
    this.reading = null; // what the current or last reading read: {kind, collection, text}
    els.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.ask();
    });
    els.form.addEventListener("keydown", (e) => { // Enter asks from a select too, as from any other field
      if (e.key === "Enter" && e.target.tagName === "SELECT" && !e.altKey) {
        e.preventDefault();
        els.form.requestSubmit();
      }
    });
    els.stop.addEventListener("click", () => this.stop());
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && this.controller) {
        e.preventDefault();
        this.stop();
      }
    });
    els.paste.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        els.form.requestSubmit();
      }
    });
  }

  get active() {
    return this.controller !== null;
  }

  status(text) {
    this.els.status.textContent = text;
  }

  async ask() {
    if (this.active) return;
    const els = this.els;
    const question = els.question.value.trim();
    if (!question) {
      els.question.focus();
      return;
    }
    const source = this.on.source();
    const body = { question, stream: true, ...this.options.values() };
    const pattern = body.reading.pattern;
    this.clearAnswer();
    try {
      if (source.kind === "paste") {
        const text = els.paste.value;
        if (!text.trim()) {
          this.status("Paste a text to read first.");
          els.paste.focus();
          return;
        }
        body.text = text;
        // auto on a pasted text takes the route by size: WiM reads a short text whole, a long one routes
        if (pattern === "auto") delete body.reading.pattern;
        this.view.show("text", text, "Pasted text", `${number.format(text.length)} characters`);
      } else {
        body.collection = source.collection;
        if (source.kind === "document") {
          body.document = source.document;
          await this.on.open(source.collection, source.document);
        }
      }
    } catch (err) {
      this.on.error(err);
      return;
    }
    this.reading = { kind: source.kind, collection: source.collection, text: body.text };
    const aligned = source.kind !== "collection";
    if (aligned) this.view.reset(pattern === "wim");
    else {
      this.view.clear();
      this.view.title.textContent = `Reading collection ${source.collection}`;
      this.view.meta.textContent = "What the search finds is read; a reference, clicked, opens its document.";
    }
    els.marginList.replaceChildren();
    els.collectionMargins.hidden = true;
    this.begin();
    this.status(source.kind === "collection" ? "Searching the collection…" : "Waiting for the model…");
    try {
      const { reply, events } = await stream("POST", "/v1/ask", body, this.controller.signal);
      this.readingId = reply.headers.get(READING_HEADER);
      this.els.stop.disabled = false;
      let done = false;
      for await (const { event, data } of events) {
        if (event === "error") throw new ApiError(0, data.error.code, data.error.message);
        this.handle(event, data, aligned);
        if (event === "done") done = true;
      }
      if (!done && !this.stopped) throw new Error("the reading ended without an answer");
    } catch (err) {
      if (err.name === "AbortError") this.status("Stopped before the reading began.");
      else this.on.error(err);
    } finally {
      this.end();
    }
  }

  begin() {
    this.controller = new AbortController();
    this.readingId = null;
    this.stopped = false;
    this.read = 0;
    this.total = 0;
    this.current = null; // the pattern whose events arrive (auto: rag, then maybe wim)
    this.els.ask.disabled = true;
    this.els.stop.disabled = false;
    this.els.progress.hidden = false;
    this.els.progress.removeAttribute("value");
    this.els.answerBox.setAttribute("aria-busy", "true");
    this.on.busy(true);
  }

  end() {
    const hadFocus = document.activeElement === this.els.stop;
    this.controller = null;
    this.readingId = null;
    this.els.ask.disabled = false;
    this.els.stop.disabled = true;
    this.els.progress.hidden = true;
    this.els.answerBox.removeAttribute("aria-busy");
    this.view.finish();
    this.on.busy(false);
    if (hadFocus) this.els.question.focus();
  }

  /** Stop reading: the server finishes the step in progress and answers from what was read. Before the
   * reading has begun (it waits for the model) there is nothing to answer from: the request is dropped. */
  async stop() {
    if (!this.controller || this.stopped) return;
    this.stopped = true;
    this.els.stop.disabled = true;
    if (!this.readingId) {
      this.controller.abort();
      return;
    }
    this.status(`Stopping after ${this.read} of ${this.total} segments; answering from what was read…`);
    try {
      await call("POST", `/v1/readings/${part(this.readingId)}/stop`);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) this.on.error(err); // 404: it was over already
    }
  }

  handle(event, data, aligned) {
    const els = this.els;
    const pattern = this.current;
    switch (event) {
      case "started":
        if (aligned && data.pattern === "wim" && pattern !== "wim") this.view.reset(true); // auto's wim reading
        this.current = data.pattern;
        this.read = 0;
        this.total = data.segments_total;
        els.progress.max = Math.max(1, data.segments_total);
        els.progress.value = 0;
        this.status(data.pattern === "wim" ? `Reading ${data.segments_total} segments…`
          : data.pattern === "rag" ? `Retrieving from ${data.segments_total} chunks…` : "Reading the whole text…");
        break;
      case "routed":
        this.status(data.taken === "wim" ? `${data.reason}: reading with WiM…`
          : data.taken === "lc" ? `${data.reason}: reading in one prompt…` : `${data.reason}.`);
        break;
      case "retrieved":
        this.status(data.outcome === "none" ? "Nothing relevant found in the collection."
          : data.outcome === "direct" ? "A stored question matches: answering from it."
          : `Found ${data.references} passages (best similarity ${data.best_similarity.toFixed(2)}); reading them…`);
        break;
      case "segment_read":
        this.read += 1;
        els.progress.value = this.read;
        if (pattern === "rag") {
          this.status(`Retrieved chunk ${data.index + 1} of ${data.total}.`);
          if (aligned) this.view.mark(data.start, data.end, "retrieved");
        } else {
          if (!this.stopped) this.status(`Reading segment ${data.index + 1} of ${data.total}…`);
          if (aligned) this.view.segment(data.index, data.start, data.end);
          else this.listMargin(data.index).textContent = "reading…";
        }
        break;
      case "margin_written":
        if (aligned) this.view.written(data.segment_index, data.text);
        else this.listMargin(data.segment_index).textContent = data.text;
        break;
      case "margin_judged":
        if (aligned) this.view.judged(data.margin);
        else fillMargin(this.listMargin(data.margin.segment_index), data.margin);
        break;
      case "answer_delta":
        if (!els.answer.dataset.streaming) {
          els.answer.dataset.streaming = "true";
          els.answerBox.hidden = false;
          this.status("Answering…");
        }
        els.answer.textContent += data.text;
        break;
      case "done":
        this.showAnswer(data);
        break;
      default:
        break;
    }
  }

  /** A collection's margins are listed (their segments are passages of several documents). */
  listMargin(index) {
    const list = this.els.marginList;
    this.els.collectionMargins.hidden = false;
    let li = list.querySelector(`li[data-segment="${index}"]`);
    if (!li) {
      li = document.createElement("li");
      li.dataset.segment = String(index);
      li.className = "margin pending";
      list.append(li);
    }
    return li;
  }

  clearAnswer() {
    const els = this.els;
    els.error.hidden = true;
    els.answerBox.hidden = true;
    els.answer.textContent = "";
    delete els.answer.dataset.streaming;
    els.cost.textContent = "";
    els.route.replaceChildren();
    els.route.hidden = true;
    els.references.replaceChildren();
    els.referencesTitle.hidden = true;
  }

  showAnswer(data) {
    const els = this.els;
    els.answerBox.hidden = false;
    els.answer.textContent = data.text;
    delete els.answer.dataset.streaming;
    els.cost.textContent = costLine(data.stats);
    if (data.route) {
      const line = routeLine(data.route);
      const taken = document.createElement("span");
      taken.className = "route-taken";
      taken.textContent = line.taken;
      els.route.replaceChildren(taken, line.reason);
      els.route.dataset.taken = data.route.taken;
      els.route.hidden = false;
    }
    const total = data.segments_total;
    const unit = (data.route ? data.route.taken : data.pattern) === "rag" ? "chunk" : "segment";
    const read = total > 1 ? ` ${data.segments_read} of ${total} ${unit}s read.` : "";
    this.status((data.stopped_early ? "Stopped early; answered from what was read." : "Done.") + read);
    els.referencesTitle.hidden = !data.references.length;
    els.references.replaceChildren(...data.references.map((ref) => this.referenceItem(ref)));
  }

  referenceItem(ref) {
    if (this.reading.kind === "paste") ref = { ...ref, source: "pasted text" };
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "ref";
    button.dataset.start = String(ref.start);
    button.dataset.end = String(ref.end);
    const place = document.createElement("span");
    place.className = "ref-place";
    place.textContent = referencePlace(ref);
    const quote = document.createElement("span");
    quote.className = "ref-quote";
    renderInline(quote, ref.text);
    button.append(place, quote);
    button.setAttribute("aria-label", `Show in the document: ${referencePlace(ref)}`);
    button.addEventListener("click", () => this.showReference(ref));
    li.append(button);
    return li;
  }

  async showReference(ref) {
    const reading = this.reading;
    try {
      if (reading.kind === "paste") {
        if (this.view.source !== "text") this.view.show("text", reading.text, "Pasted text");
      } else if (this.view.source !== ref.source) {
        if (this.active) {
          this.status("The reading is still going: stop it or wait to open another document.");
          return;
        }
        await this.on.open(reading.collection, ref.source);
      }
      this.view.highlight(ref.start, ref.end);
    } catch (err) {
      this.on.error(err);
    }
  }
}
