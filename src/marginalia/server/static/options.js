// The reading options, built from the JSON Schema the server derives from its registry of patterns
// (GET /v1/patterns): the patterns, their descriptions and each one's options come from the options records,
// with their defaults, bounds and descriptions; nothing about a pattern is written here. Only values changed
// from a default are sent, so the server fills in the rest.

import { call } from "./api.js";

export function deref(schema, spec) {
  const ref = spec && spec.$ref;
  return ref ? schema.components.schemas[ref.split("/").pop()] : spec;
}

/** The field's own schema (the non-null branch of `X | None`) and whether it may be left empty. */
function unwrap(spec) {
  if (spec.anyOf) {
    const inner = spec.anyOf.find((s) => s.type !== "null") || {};
    return { type: inner, nullable: spec.anyOf.some((s) => s.type === "null") };
  }
  return { type: spec, nullable: false };
}

function label(name) {
  const text = name.replace(/_/g, " ");
  return text[0].toUpperCase() + text.slice(1);
}

/** A description without the record's "wim: " prefix (`names`: the patterns; one is chosen already). */
function hint(spec, names) {
  const text = spec.description || "";
  const match = text.match(/^([a-z0-9_]+)(?=[:,])[:,]?\s*/);
  return match && names.includes(match[1]) ? text.slice(match[0].length) : text;
}

class Field {
  constructor(prefix, name, spec, names) {
    this.name = name;
    const { type, nullable } = unwrap(spec);
    this.type = type;
    this.nullable = nullable;
    this.default = spec.default === undefined ? null : spec.default;
    const id = `opt-${prefix}-${name}`;
    this.el = document.createElement("div");
    this.el.className = "option";
    const lab = document.createElement("label");
    lab.htmlFor = id;
    lab.textContent = label(name);
    const help = document.createElement("p");
    help.className = "hint";
    help.id = `${id}-hint`;
    help.textContent = hint(spec, names);
    this.input = this.build(id);
    this.input.setAttribute("aria-describedby", help.id);
    if (type.type === "boolean") {
      lab.prepend(this.input);
      this.el.classList.add("check");
      this.el.append(lab, help);
    } else {
      this.el.append(lab, this.input, help);
    }
  }

  build(id) {
    const t = this.type;
    let input;
    if (t.enum) {
      input = document.createElement("select");
      if (this.nullable) input.append(new Option("default", ""));
      for (const value of t.enum) input.append(new Option(value, value));
      input.value = this.default === null ? "" : this.default;
    } else if (t.type === "boolean") {
      input = document.createElement("input");
      input.type = "checkbox";
      input.checked = Boolean(this.default);
    } else {
      input = document.createElement("input");
      input.type = t.type === "integer" || t.type === "number" ? "number" : "text";
      input.step = t.type === "integer" ? "1" : "any";
      const min = t.minimum ?? (t.exclusiveMinimum !== undefined && t.type === "integer"
        ? t.exclusiveMinimum + 1 : t.exclusiveMinimum);
      if (min !== undefined) input.min = String(min);
      if (t.maximum !== undefined) input.max = String(t.maximum);
      input.value = this.default === null ? "" : String(this.default);
      if (this.nullable) input.placeholder = "default";
    }
    input.id = id;
    input.name = this.name;
    return input;
  }

  /** The value to send, or undefined when it is the default (the server fills those in). */
  value() {
    let v;
    if (this.type.type === "boolean") v = this.input.checked;
    else if (this.input.value === "") return undefined;
    else if (this.type.type === "integer" || this.type.type === "number") v = Number(this.input.value);
    else v = this.input.value;
    return v === this.default ? undefined : v;
  }
}

/** A fieldset of inputs for a record's fields (but those in `skip`), each with its label, bounds and help
 * (`names`: the patterns, whose name a description may open with). */
export function group(prefix, legendText, schema, skip, names = []) {
  const fieldset = document.createElement("fieldset");
  fieldset.className = "option-group";
  const legend = document.createElement("legend");
  legend.textContent = legendText;
  fieldset.append(legend);
  const fields = Object.entries(schema.properties || {})
    .filter(([name]) => !skip.includes(name))
    .map(([name, spec]) => new Field(prefix, name, spec, names));
  fieldset.append(...fields.map((f) => f.el));
  return { fieldset, fields };
}

/** The fields' values that differ from their defaults. */
export function collect(fields) {
  const out = {};
  for (const f of fields) {
    const v = f.value();
    if (v !== undefined) out[f.name] = v;
  }
  return out;
}

export class ReadingOptions {
  constructor(patternsEl, optionsEl, summaryEl, hintEl) {
    this.patternsEl = patternsEl;
    this.hintEl = hintEl; // the chosen pattern's description, in a few words
    this.optionsEl = optionsEl;
    this.summaryEl = summaryEl;
    this.patterns = new Map(); // name -> {description, group}
    this.collection = null;
    this.general = null;
  }

  async load() {
    if (this.patterns.size) return; // loaded already (before the server's key was asked for, say)
    const schema = await call("GET", "/v1/patterns");
    const readings = schema.properties.reading.oneOf;
    const names = readings.map((reading) => reading.title);
    for (const reading of readings) {
      const name = reading.title;
      const description = reading.description || name;
      const short = description.replace(/[:(].*$/, "").trim(); // the first words, before a colon or an aside
      this.patterns.set(name, { description, short,
                                ...group(name, `${name}: ${description}`, reading, ["pattern"], names) });
    }
    this.general = group("ask", "Answer", { properties: { temperature: schema.properties.temperature } }, []);
    this.collection = group("collection", "Reading a collection", schema.properties.collection_options, [],
                            names);
    this.renderPatterns();
    this.optionsEl.replaceChildren(...[...this.patterns.values()].map((p) => p.fieldset),
                                   this.general.fieldset, this.collection.fieldset);
    this.optionsEl.addEventListener("input", () => this.summarise());
    this.optionsEl.addEventListener("change", () => this.summarise());
    this.select(this.patterns.keys().next().value);
  }

  renderPatterns() {
    const items = [];
    for (const [name, p] of this.patterns) {
      const id = `pattern-${name}`;
      const input = document.createElement("input");
      input.type = "radio";
      input.name = "pattern";
      input.value = name;
      input.id = id;
      input.addEventListener("change", () => this.select(name));
      const lab = document.createElement("label");
      lab.htmlFor = id;
      lab.title = p.description;
      lab.textContent = name;
      const desc = document.createElement("span");
      desc.className = "visually-hidden";
      desc.textContent = `: ${p.description}`;
      lab.append(desc);
      items.push(input, lab);
    }
    this.patternsEl.replaceChildren(...items);
  }

  get pattern() {
    const checked = this.patternsEl.querySelector("input:checked");
    return checked ? checked.value : "auto";
  }

  select(name) {
    const radio = this.patternsEl.querySelector(`input[value="${name}"]`);
    if (radio) radio.checked = true;
    for (const [other, p] of this.patterns) p.fieldset.hidden = other !== name;
    if (this.hintEl && this.patterns.has(name)) this.hintEl.textContent = this.patterns.get(name).short;
    this.summarise();
  }

  /** Show the collection's options only when a whole collection is read. */
  setCollection(on) {
    if (this.collection) this.collection.fieldset.hidden = !on;
    this.collectionOn = on;
    this.summarise();
  }

  /** The request's parts: `reading`, `collection_options` and `temperature` where they differ. */
  values() {
    const pattern = this.pattern;
    const body = { reading: { pattern, ...collect(this.patterns.get(pattern).fields) } };
    Object.assign(body, collect(this.general.fields));
    if (this.collectionOn) {
      const options = collect(this.collection.fields);
      if (Object.keys(options).length) body.collection_options = options;
    }
    return body;
  }

  summarise() {
    if (!this.patterns.size) return;
    const body = this.values();
    const changed = { ...body.reading, ...(body.collection_options || {}) };
    delete changed.pattern;
    if (body.temperature !== undefined) changed.temperature = body.temperature;
    const parts = Object.entries(changed).map(([k, v]) => `${k.replace(/_/g, " ")} ${v}`);
    this.summaryEl.textContent = parts.length ? `(${parts.join(", ")})` : "(defaults)";
  }
}
