// The library: collections, uploading documents into one (following each indexing job), and the
// collection's documents, each with its section tree.

import { call, part, stream } from "./api.js";

const STAGES = { queued: "waiting", loading: "reading the file", embedding: "embedding", optimizing: "indexing",
                 finished: "finished" };

export class Library {
  /**
   * @param {object} els the library's elements (collection select, forms, lists)
   * @param {object} on callbacks: `collection(detail)` when the collection or its documents change,
   *   `open(document, section)` to show a document (at a section), `error(err)`, `status(text)`
   */
  constructor(els, on) {
    this.els = els;
    this.on = on;
    this.detail = null;
    this.me = null; // the caller's grants (GET /v1/me): what it may read and write, admin
    els.collection.addEventListener("change", () => this.select(els.collection.value));
    els.create.addEventListener("submit", (e) => {
      e.preventDefault();
      this.create(els.createName.value.trim());
    });
    els.upload.addEventListener("submit", (e) => {
      e.preventDefault();
      this.upload([...els.files.files]);
    });
  }

  get name() {
    return this.detail ? this.detail.name : null;
  }

  /** The caller's grants: only what they allow is shown (the server checks every request anyway). */
  setGrants(me) {
    this.me = me;
    this.els.createBox.hidden = !me.admin;
    this.showUpload();
  }

  canWrite(name) {
    return !this.me || this.me.admin || (name !== null && this.me.write.includes(name));
  }

  /** The upload form only for a collection the key may write: a read-only key sees none. */
  showUpload() {
    this.els.upload.hidden = !this.canWrite(this.name);
  }

  /** Load the collections and select `wanted` (or the one selected before, or the first). */
  async load(wanted) {
    const collections = await call("GET", "/v1/collections");
    const select = this.els.collection;
    const keep = wanted || select.value || localStorage.getItem("marginalia.collection");
    select.replaceChildren(...collections.map((c) => new Option(`${c.name} (${c.documents})`, c.name)));
    if (!collections.length) {
      select.append(new Option("no collections yet", ""));
      select.disabled = true;
      this.els.createBox.open = true;
      this.els.upload.querySelector("button").disabled = true;
      this.detail = null;
      this.showUpload();
      this.renderDocuments();
      this.on.collection(null);
      return;
    }
    select.disabled = false;
    this.els.upload.querySelector("button").disabled = false;
    const name = collections.some((c) => c.name === keep) ? keep : collections[0].name;
    select.value = name;
    await this.select(name);
  }

  async select(name) {
    try {
      this.detail = await call("GET", `/v1/collections/${part(name)}`);
      localStorage.setItem("marginalia.collection", name);
    } catch (err) {
      this.detail = null;
      this.on.error(err);
    }
    this.showUpload();
    this.renderDocuments();
    this.on.collection(this.detail);
  }

  async create(name) {
    if (!name) return;
    try {
      await call("POST", "/v1/collections", { name });
      this.els.createName.value = "";
      this.els.createBox.open = false;
      await this.load(name);
      this.on.status(`Collection ${name} created; add documents to it.`);
      this.els.files.focus();
    } catch (err) {
      this.on.error(err);
    }
  }

  /** Upload files one after another, each followed until it is indexed. */
  async upload(files) {
    const name = this.name;
    if (!name || !files.length) {
      this.els.files.focus();
      return;
    }
    this.els.files.value = "";
    const items = files.map((file) => jobItem(file.name));
    this.els.jobs.append(...items.map((item) => item.li));
    for (const [i, file] of files.entries()) {
      items[i].uploading();
      try {
        const form = new FormData();
        form.append("file", file, file.name);
        const job = await call("POST", `/v1/collections/${part(name)}/documents`, form);
        await this.follow(job, items[i]);
        await this.load(name); // its document is listed, and the collection's count changes
      } catch (err) {
        items[i].fail(err.message);
      }
    }
  }

  async follow(job, item) {
    item.update(job);
    const { events } = await stream("GET", `/v1/jobs/${part(job.id)}/events`);
    for await (const { event, data } of events) {
      item.update(data);
      if (event === "failed") throw new Error(data.error ? data.error.message : "indexing failed");
      if (event === "done") return;
    }
  }

  renderDocuments() {
    const list = this.els.documents;
    const docs = this.detail ? this.detail.documents : [];
    if (!docs.length) {
      const li = document.createElement("li");
      li.className = "empty";
      li.textContent = !this.detail ? (this.me && !this.me.admin ? "This key may read no collection yet."
        : "Create a collection first.")
        : this.canWrite(this.name) ? "No documents yet: upload some above." : "No documents yet.";
      list.replaceChildren(li);
      return;
    }
    list.replaceChildren(...docs.map((doc) => this.documentItem(doc)));
  }

  documentItem(doc) {
    const li = document.createElement("li");
    li.className = "document";
    li.dataset.source = doc.source;
    const open = document.createElement("button");
    open.type = "button";
    open.className = "doc-open";
    open.textContent = doc.title && doc.title !== doc.source ? `${doc.source} — ${doc.title}` : doc.source;
    open.title = `${doc.format}, ${doc.chunks} chunks`;
    open.addEventListener("click", () => this.on.open(doc.source, null));
    li.append(open);
    const tree = doc.sections;
    if (tree && tree.children.length) {
      const details = document.createElement("details");
      details.className = "tree";
      const summary = document.createElement("summary");
      summary.textContent = `Sections (${countSections(tree)})`;
      details.append(summary, sectionList(tree.children, (section) => this.on.open(doc.source, section)));
      li.append(details);
    }
    return li;
  }
}

function countSections(node) {
  return node.children.reduce((n, child) => n + 1 + countSections(child), 0);
}

function sectionList(sections, open) {
  const ul = document.createElement("ul");
  for (const section of sections) {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "section";
    button.textContent = section.title;
    if (section.page) button.textContent += `  p. ${section.page}`;
    button.addEventListener("click", () => open(section));
    li.append(button);
    if (section.children.length) li.append(sectionList(section.children, open));
    ul.append(li);
  }
  return ul;
}

/** One upload's line: its name, a progress bar and what the job is doing. */
function jobItem(name) {
  const li = document.createElement("li");
  li.className = "job";
  const label = document.createElement("span");
  label.className = "job-name";
  label.textContent = name;
  const bar = document.createElement("progress");
  bar.setAttribute("aria-label", `Indexing ${name}`);
  const state = document.createElement("span");
  state.className = "job-state";
  state.textContent = "waiting to upload";
  li.append(label, bar, state);
  return {
    li,
    uploading() {
      state.textContent = "uploading";
    },
    update(job) {
      const duplicate = job.status === "done" && job.result && job.result.status === "duplicate";
      li.dataset.status = duplicate ? "duplicate" : job.status; // done, but nothing added under this name
      if (job.chunks_total) {
        bar.max = job.chunks_total;
        bar.value = job.chunks_done;
      }
      if (job.status === "done") {
        bar.max = 1;
        bar.value = 1;
        const r = job.result || {};
        state.textContent = r.status === "unchanged" ? "already indexed, unchanged"
          : duplicate ? `not added: the same text is already here as ${r.source}`
          : `indexed: ${r.chunks} chunks, ${r.sections} sections`;
      } else {
        state.textContent = STAGES[job.stage] || job.stage;
        if (job.stage === "embedding" && job.chunks_total) state.textContent += ` ${job.chunks_done}/${job.chunks_total}`;
      }
    },
    fail(message) {
      li.dataset.status = "failed";
      bar.remove();
      state.textContent = message;
      state.setAttribute("role", "alert");
    },
  };
}
