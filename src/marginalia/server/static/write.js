// Writing: a text area whose next words are suggested in grey (ghost text) once the writer pauses at its end,
// from a compose session over a collection (POST /v1/compose/sessions). Tab accepts the suggestion, Escape
// dismisses it, typing dismisses it and cancels the request (the server stops writing it). Beside the text,
// the memory the suggestions draw on, each item with its source.

import { ApiError, call, callOnLeave, part, stream } from "./api.js";
import { collect, deref, group } from "./options.js";

/** Milliseconds of no typing before a suggestion is asked for. */
export const PAUSE_MS = 300;
/** Milliseconds between looks at the memory while it is being refreshed. */
const POLL_MS = 600;
/** Options the page sets itself: it waits for the pause (the server need not wait again), and the server
 * chooses the memory model. */
const PAGE_SET = ["debounce", "memory_model"];

/** Where a memory item comes from, as one line: document › section path. */
export function itemPlace(item) {
  return [item.document, ...item.section_path].filter(Boolean).join(" › ");
}

export class Writer {
  /**
   * @param {object} els the view's elements (collection picker, options, editor, mirror, ghost, status, memory)
   * @param {object} on `current()` -> the library's collection, `show(collection, document, start, end)` ->
   *   shows a span of a document in the Read view
   */
  constructor(els, on) {
    this.els = els;
    this.on = on;
    this.session = null; // {id, key}
    this.starting = null; // {key, promise}
    this.failedKey = null; // a session that could not start is not asked for again until something changes
    this.fields = null;
    this.ghost = "";
    this.controller = null;
    this.timer = null;
    this.pollTimer = null;
    this.memory = null;
    this.notice = "";
    this.active = false;
    const draft = els.draft;
    draft.addEventListener("input", () => this.changed());
    draft.addEventListener("keydown", (e) => this.key(e));
    draft.addEventListener("scroll", () => this.syncScroll());
    for (const type of ["click", "keyup", "select"]) {
      draft.addEventListener(type, () => {
        if (!this.atEnd() && (this.ghost || this.controller || this.timer)) this.dismiss();
      });
    }
    draft.addEventListener("blur", () => this.dismiss());
    els.collection.addEventListener("change", () => this.restart());
    els.options.addEventListener("change", () => this.restart());
    window.addEventListener("pagehide", () => this.endSession(true));
    new ResizeObserver(() => this.syncScroll()).observe(draft);
    this.setState("idle");
  }

  // -- the view --------------------------------------------------------------------------------------------

  /** The view is shown: list the collections and start a session (its models load while the writer begins). */
  async activate() {
    this.active = true;
    try {
      if (!this.fields) await this.loadOptions();
      if (!this.els.collection.options.length) await this.loadCollections();
      await this.ensureSession();
    } catch (err) {
      this.showError(err);
    }
  }

  deactivate() {
    this.active = false;
    this.dismiss();
  }

  async loadOptions() {
    const schema = await call("GET", "/openapi.json");
    const request = schema.components.schemas.ComposeSessionRequest;
    const record = deref(schema, request.properties.options);
    const { fieldset, fields } = group("compose", "Composing", record, PAGE_SET);
    this.fields = fields;
    this.els.options.replaceChildren(fieldset);
    this.els.options.addEventListener("input", () => this.summarise());
    this.summarise();
  }

  /** The collections to draw memory from (the library's selected one first chosen). */
  async loadCollections() {
    const collections = await call("GET", "/v1/collections");
    const select = this.els.collection;
    const before = select.value || this.on.current();
    select.replaceChildren(...collections.map((c) => new Option(
      `${c.name} (${c.documents} document${c.documents === 1 ? "" : "s"})`, c.name)));
    if (!collections.length) select.append(new Option("no collections yet", ""));
    select.disabled = !collections.length;
    if (collections.some((c) => c.name === before)) select.value = before;
  }

  /** The library's collections or documents changed: list them again, and try again what failed. */
  async collectionsChanged() {
    this.failedKey = null;
    if (!this.els.collection.options.length) return; // not shown yet: listed when it is
    try {
      await this.loadCollections();
      if (this.active) await this.ensureSession();
    } catch (err) {
      this.showError(err);
    }
  }

  options() {
    return { ...(this.fields ? collect(this.fields) : {}), debounce: 0 };
  }

  summarise() {
    const changed = this.fields ? collect(this.fields) : {};
    const parts = Object.entries(changed).map(([k, v]) => `${k.replace(/_/g, " ")} ${v}`);
    this.els.optionsSummary.textContent = parts.length ? `(${parts.join(", ")})` : "(defaults)";
  }

  setState(state) {
    this.els.editor.dataset.state = state;
  }

  status(text) {
    this.els.status.textContent = text;
  }

  showError(err) {
    const box = this.els.error;
    box.textContent = err.message || String(err);
    box.hidden = false;
  }

  clearError() {
    this.els.error.hidden = true;
    this.els.error.textContent = "";
  }

  // -- the session -----------------------------------------------------------------------------------------

  /** The session for the chosen collection and options: the one there is, or a new one (null when none
   * can be had; the error is shown). */
  async ensureSession() {
    const collection = this.els.collection.value;
    if (!collection) {
      this.status("Create a collection and add documents to it (in the library) to draw memory from.");
      return null;
    }
    const options = this.options();
    const key = JSON.stringify([collection, options]);
    if (this.session && this.session.key === key) return this.session.id;
    if (this.starting && this.starting.key === key) return this.starting.promise;
    if (this.failedKey === key) return null;
    this.endSession();
    const promise = this.startSession(collection, options, key);
    this.starting = { key, promise };
    return promise;
  }

  async startSession(collection, options, key) {
    this.status(`Loading the models to write with memory from ${collection}…`);
    this.setState("starting");
    try {
      const session = await call("POST", "/v1/compose/sessions", { collection, options });
      if (!this.starting || this.starting.key !== key) { // the collection or options changed meanwhile
        callOnLeave("DELETE", `/v1/compose/sessions/${part(session.id)}`);
        return null;
      }
      this.session = { id: session.id, key, collection };
      this.clearError();
      this.memory = null;
      this.notice = "";
      this.showMemory(session.memory);
      this.setState("idle");
      if (this.els.draft.value.trim() && this.atEnd()) this.schedule();
      return session.id;
    } catch (err) {
      this.failedKey = key;
      this.setState("idle");
      this.status("");
      this.showError(err);
      return null;
    } finally {
      if (this.starting && this.starting.key === key) this.starting = null;
    }
  }

  /** End the session (as the page goes away too: the server lends its models to the next one). */
  endSession(leaving = false) {
    this.dismiss();
    clearTimeout(this.pollTimer);
    const session = this.session;
    this.session = null;
    if (!session) return;
    if (leaving) callOnLeave("DELETE", `/v1/compose/sessions/${part(session.id)}`);
    else call("DELETE", `/v1/compose/sessions/${part(session.id)}`).catch(() => {}); // gone already: fine
  }

  /** The collection or the options changed: a new session, and a new memory. */
  restart() {
    this.failedKey = null;
    this.clearError();
    this.renderItems([]);
    this.els.memoryMeta.textContent = "";
    if (this.active) this.ensureSession();
  }

  // -- typing ----------------------------------------------------------------------------------------------

  atEnd() {
    const d = this.els.draft;
    return d.selectionStart === d.selectionEnd && d.selectionEnd === d.value.length;
  }

  /** The text changed: what was suggested is gone, and a suggestion is asked for after a pause. */
  changed() {
    this.dismiss();
    if (this.els.draft.value.trim() && this.atEnd()) this.schedule();
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = null;
      this.suggest();
    }, PAUSE_MS);
    this.setState("waiting");
  }

  key(e) {
    if (e.key === "Tab" && !e.shiftKey && !e.ctrlKey && !e.altKey && !e.metaKey && this.ghost) {
      e.preventDefault();
      this.accept();
    } else if (e.key === "Escape") {
      e.stopPropagation(); // Escape here is about the suggestion, never a reading going on in the Read view
      if (this.ghost || this.controller || this.timer) {
        e.preventDefault();
        this.dismiss();
        this.els.live.textContent = "Suggestion dismissed.";
      }
    }
  }

  /** Put the suggestion into the text (one undo step where the browser allows it). */
  accept() {
    const ghost = this.ghost;
    const draft = this.els.draft;
    this.dismiss();
    draft.focus();
    const end = draft.value.length;
    draft.setSelectionRange(end, end);
    // insertText keeps the browser's undo history and fires "input" (which asks for the next suggestion)
    if (!document.execCommand("insertText", false, ghost)) {
      draft.setRangeText(ghost, end, end, "end");
      this.changed();
    }
    this.els.live.textContent = "Suggestion accepted.";
  }

  /** Drop the suggestion shown or coming (its request is aborted: the server stops writing it). */
  dismiss() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.controller) {
      this.controller.abort();
      this.controller = null;
    }
    this.ghost = "";
    this.render();
    this.setState("idle");
  }

  async suggest() {
    const text = this.els.draft.value;
    if (!text.trim() || !this.atEnd() || document.activeElement !== this.els.draft) {
      this.setState("idle");
      return;
    }
    const id = await this.ensureSession();
    if (!id || this.els.draft.value !== text || this.timer) return; // no session, or more typing meanwhile
    const controller = new AbortController();
    this.controller = controller;
    this.setState("suggesting");
    try {
      const path = `/v1/compose/sessions/${part(id)}/suggestions`;
      const { events } = await stream("POST", path, { text, stream: true }, controller.signal);
      for await (const { event, data } of events) {
        if (this.controller !== controller) return; // dismissed, or typed over
        if (event === "delta") {
          this.ghost += data.text;
          this.render();
        } else if (event === "done") {
          this.ghost = data.cancelled ? "" : data.suggestion;
          this.render();
          this.showMemory(data.memory);
          if (this.ghost) this.els.live.textContent = `Suggestion: ${this.ghost.trim()}. Tab accepts, Escape dismisses.`;
        } else if (event === "error") {
          throw new ApiError(0, data.error.code, data.error.message);
        }
      }
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err instanceof ApiError && err.status === 404 && this.session && this.session.id === id) {
        this.session = null; // it expired or made room for another: a new one next time
        this.status("The writing session had ended; starting a new one.");
        this.schedule();
        return;
      }
      this.showError(err);
    } finally {
      if (this.controller === controller) {
        this.controller = null;
        this.setState(this.ghost ? "shown" : "idle");
      }
    }
  }

  // -- showing ---------------------------------------------------------------------------------------------

  /** The mirror behind the text area holds the same text (transparent) and, after it, the ghost text. */
  render() {
    this.els.mirrorText.textContent = this.els.draft.value;
    this.els.ghost.textContent = this.ghost;
    this.syncScroll();
  }

  syncScroll() {
    this.els.mirror.scrollTop = this.els.draft.scrollTop;
  }

  /** The memory as the server reports it: its items (drawn again when it changed), and the status line. */
  showMemory(memory) {
    if (!memory) return;
    for (const notice of memory.notices) this.notice = notice; // given once by the server: kept here
    if (!memory.failing) this.notice = "";
    const panel = this.els.memoryPanel;
    panel.dataset.state = memory.failing ? "failing" : memory.refreshing ? "refreshing" : "ready";
    if (!this.memory || this.memory.version !== memory.version) this.renderItems(memory.items);
    this.memory = memory;
    const count = memory.items.length;
    const collection = this.session ? this.session.collection : this.els.collection.value;
    this.els.memoryMeta.textContent = count
      ? `${count} item${count === 1 ? "" : "s"} from ${collection}, oldest first`
      : `Nothing yet: memory is drawn from ${collection} as the text grows.`;
    if (memory.failing) {
      this.status(`Memory model failed: ${this.notice || memory.error}`);
    } else if (memory.refreshing) {
      this.status("Refreshing memory…");
    } else {
      this.status(count ? `Memory ready: ${count} item${count === 1 ? "" : "s"}.` : "Ready: write, and pause for a suggestion.");
    }
    clearTimeout(this.pollTimer);
    if (memory.refreshing && this.session) this.pollTimer = setTimeout(() => this.poll(), POLL_MS);
  }

  async poll() {
    const session = this.session;
    if (!session) return;
    try {
      const memory = await call("GET", `/v1/compose/sessions/${part(session.id)}/memory`);
      if (this.session === session) this.showMemory(memory);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        if (this.session === session) this.session = null;
      } else {
        this.showError(err);
      }
    }
  }

  renderItems(items) {
    const list = this.els.memoryItems;
    if (!items.length) {
      list.replaceChildren();
      return;
    }
    list.replaceChildren(...items.map((item) => this.memoryItem(item)));
  }

  memoryItem(item) {
    const li = document.createElement("li");
    li.className = "memory-item";
    li.dataset.kind = item.kind;
    const text = document.createElement("p");
    text.className = "memory-text";
    text.textContent = item.text;
    const source = document.createElement("button");
    source.type = "button";
    source.className = "memory-source";
    source.dataset.start = String(item.start);
    source.dataset.end = String(item.end);
    const place = document.createElement("span");
    place.className = "ref-place";
    place.textContent = itemPlace(item);
    const span = document.createElement("span");
    span.className = "memory-span";
    span.textContent = `${item.kind === "margin" ? "quoted from" : "written from"} characters ${item.start}–${item.end}`;
    source.append(place, span);
    source.setAttribute("aria-label", `Show the source in the document: ${itemPlace(item)}`);
    const collection = this.session ? this.session.collection : this.els.collection.value;
    source.addEventListener("click", () => this.on.show(collection, item.document, item.start, item.end));
    li.append(text, source);
    return li;
  }
}
