// A small markdown reader for the document view: the blocks of a text (headings, paragraphs, list items, quotes,
// code, tables) and, inside them, runs of visible characters with their styles, each run a span [start, end) of
// the text itself. The markup (`#`, `**`, list markers, table pipes, tags, comments) is left out of every run,
// so the page shows rendered text while each character on it keeps its offset: a reference's span, given in
// characters of the stored text, highlights exactly what it covers. A library would render the same text but
// lose those offsets.

const ATX = /^ {0,3}(#{1,6})(?:[ \t]+|$)/;
const CLOSING = /[ \t]+#+[ \t]*$|^#+[ \t]*$/;
const FENCE = /^ {0,3}(`{3,}|~{3,})/;
const RULE = /^ {0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$/;
const SETEXT = /^ {0,3}(=+|-+)[ \t]*$/;
const ITEM = /^( *)([-+*]|(\d{1,9})[.)])(?:[ \t]+|$)/;
const QUOTE = /^ {0,3}> ?/;
const TABLE_ROW = /^ {0,3}\|/;
const TABLE_RULE = /^ {0,3}\|?(?:[ \t]*:?-+:?[ \t]*\|)+[ \t]*(?::?-+:?[ \t]*)?$/;
const COMMENT_LINE = /^ {0,3}<!--/;
const BLANK = /^[ \t]*$/;

// inline: backslash escapes, HTML tags, links and images, strikethrough (code spans, comments: see `inline`)
const ESCAPE = /\\([!"#$%&'()*+,\-./:;<=>?@[\\\]^_`{|}~])/g;
const TAG = /<\/?[A-Za-z][A-Za-z0-9-]*(?:\s+[^<>]*?)?\s*\/?>/g;
const LINK = /(!?)\[([^\[\]\n]*)\]\(([^()\s]*(?:\s+"[^"\n]*")?)\)/g;
const STRIKE = /~~(?=\S)([\s\S]*?\S)~~/g;
const PUNCT = /[!-/:-@[-`{-~\p{P}\p{S}]/u;
// how many open delimiter runs a closing one looks back through (bounds the work on a text of unmatched ones)
const LOOKBACK = 64;

/** The lines of `text`: [start, end without the newline, end with it]. */
function lines(text) {
  const out = [];
  let at = 0;
  while (at < text.length) {
    const nl = text.indexOf("\n", at);
    const end = nl < 0 ? text.length : nl;
    out.push([at, end, nl < 0 ? end : nl + 1]);
    at = nl < 0 ? text.length : nl + 1;
  }
  return out;
}

/**
 * Parse a markdown text into blocks: `{tag, start, end, runs}` where `tag` is h1…h6, p, li, blockquote, pre, hr
 * or table (a table has `rows` of `{header, cells: [runs]}` instead of runs; a list item has `list` "ul" or
 * "ol", `depth` and, in an ordered list, `number`). A run is `{start, end, marks}`: characters of the text
 * shown with the styles in `marks` (strong, em, code, del, link); a run with `br` is a line break (a `<br>`)
 * at `start`, with no characters.
 */
export function parse(text) {
  const all = lines(text);
  const line = (i) => text.slice(all[i][0], all[i][1]);
  const blocks = [];
  let para = null; // {tag, start, end, segments, list?, depth?}

  const flush = () => {
    if (!para) return;
    para.runs = inline(text, para.segments);
    delete para.segments;
    blocks.push(para);
    para = null;
  };

  for (let i = 0; i < all.length; i++) {
    const [start, end, next] = all[i];
    const content = line(i);
    if (BLANK.test(content)) {
      if (para && para.tag === "li") para.gap = true; // an indented line after it still belongs to the item
      else flush();
      continue;
    }
    if (para && para.tag === "li" && para.gap) {
      const indent = content.match(/^ */)[0].length;
      if (indent >= para.indent && !ITEM.test(content)) { // a later paragraph of the same item
        para.segments.push([start + indent, next]);
        para.end = next;
        para.gap = false;
        continue;
      }
      flush();
    }
    const fence = content.match(FENCE);
    if (fence) {
      flush();
      let j = i + 1;
      const close = new RegExp(`^ {0,3}${fence[1][0] === "`" ? "`" : "~"}{${fence[1].length},}[ \\t]*$`);
      while (j < all.length && !close.test(line(j))) j++;
      const inner = i + 1 < all.length ? all[i + 1][0] : next;
      const innerEnd = j < all.length ? all[j][0] : text.length;
      const blockEnd = j < all.length ? all[j][2] : text.length;
      blocks.push({ tag: "pre", start, end: blockEnd,
                    runs: innerEnd > inner ? [{ start: inner, end: innerEnd, marks: ["code"] }] : [] });
      i = j;
      continue;
    }
    const atx = content.match(ATX);
    if (atx) {
      flush();
      let body = content.slice(atx[0].length);
      const closing = body.match(CLOSING);
      if (closing) body = body.slice(0, closing.index);
      const from = start + atx[0].length;
      blocks.push({ tag: `h${atx[1].length}`, start, end: next, runs: inline(text, [[from, from + body.length]]) });
      continue;
    }
    const setext = content.match(SETEXT);
    if (setext && para && para.tag === "p") {
      para.tag = setext[1][0] === "=" ? "h1" : "h2";
      trimLastNewline(para, text);
      para.end = next;
      flush();
      continue;
    }
    if (RULE.test(content)) {
      flush();
      blocks.push({ tag: "hr", start, end: next, runs: [] });
      continue;
    }
    if (COMMENT_LINE.test(content)) { // an HTML comment block: nothing to show
      flush();
      let j = i;
      while (j < all.length && !line(j).includes("-->")) j++;
      i = Math.min(j, all.length - 1);
      continue;
    }
    if (TABLE_ROW.test(content) && i + 1 < all.length && TABLE_RULE.test(line(i + 1))) {
      flush();
      const rows = [];
      let j = i;
      while (j < all.length && TABLE_ROW.test(line(j))) {
        if (j !== i + 1) rows.push({ header: j === i, cells: cells(text, all[j][0], all[j][1]) });
        j++;
      }
      blocks.push({ tag: "table", start, end: all[j - 1][2], rows });
      i = j - 1;
      continue;
    }
    const item = content.match(ITEM);
    if (item) {
      flush();
      const depth = Math.floor(item[1].length / 2);
      para = { tag: "li", list: item[3] ? "ol" : "ul", depth, start, end: next, indent: item[0].length,
               segments: [[start + item[0].length, next]] };
      if (item[3]) para.number = Number(item[3]);
      continue;
    }
    const quote = content.match(QUOTE);
    if (quote) {
      if (!para || para.tag !== "blockquote") {
        flush();
        para = { tag: "blockquote", start, end: next, segments: [] };
      }
      para.segments.push([start + quote[0].length, next]);
      para.end = next;
      continue;
    }
    if (!para) para = { tag: "p", start, end: next, segments: [] };
    // a lazy continuation line: it carries on the paragraph, item or quote
    para.segments.push([start + (content.length - content.trimStart().length), next]);
    para.end = next;
  }
  flush();
  return blocks;
}

function trimLastNewline(block, text) {
  const last = block.segments[block.segments.length - 1];
  if (last && last[1] > last[0] && text[last[1] - 1] === "\n") last[1] -= 1;
}

/** The cells of a table row [start, end): the text between its pipes, trimmed. */
function cells(text, start, end) {
  const out = [];
  let at = start;
  while (at < end && text[at] === " ") at++;
  if (text[at] === "|") at++;
  let from = at;
  for (let k = at; k <= end; k++) {
    if (k === end || (text[k] === "|" && text[k - 1] !== "\\")) {
      let a = from;
      let b = k;
      while (a < b && /\s/.test(text[a])) a++;
      while (b > a && /\s/.test(text[b - 1])) b--;
      if (k < end || b > a) out.push(inline(text, [[a, b]]));
      from = k + 1;
    }
  }
  return out;
}

/**
 * The visible runs of inline markdown spread over `segments` ([start, end) pieces of `text`, in order: a
 * paragraph's lines without their quote or list prefixes). Code spans, escapes, tags and comments, links and
 * emphasis are recognised; what is left unmatched stays visible as it is.
 */
function inline(text, segments) {
  let s = "";
  const pos = [];
  for (const [a, b] of segments) {
    for (let k = a; k < b; k++) pos.push(k);
    s += text.slice(a, b);
  }
  while (s.length && /\n/.test(s[s.length - 1])) { // a block's last newline is no part of it
    s = s.slice(0, -1);
    pos.pop();
  }
  const n = s.length;
  const hidden = new Uint8Array(n);
  const fixed = new Uint8Array(n); // no emphasis delimiter here: code, escaped, tags, link targets
  const styles = []; // [from, to, mark]
  const hide = (a, b) => { for (let k = a; k < b; k++) { hidden[k] = 1; fixed[k] = 1; } };
  const fix = (a, b) => { for (let k = a; k < b; k++) fixed[k] = 1; };
  const free = (a, b) => { for (let k = a; k < b; k++) if (fixed[k]) return false; return true; };

  // a code span runs from a run of backticks to the next run of as many (found without scanning ahead from each)
  const ticks = [...s.matchAll(/`+/g)].map((m) => [m.index, m[0].length]);
  const later = new Map(); // run length -> the indices in `ticks` of the runs that long, in order
  ticks.forEach(([, length], i) => (later.get(length) || later.set(length, []).get(length)).push(i));
  const seen = new Map(); // run length -> how many of those runs lie before the one at hand
  for (let i = 0; i < ticks.length; i++) {
    const [at, length] = ticks[i];
    const same = later.get(length);
    let k = seen.get(length) || 0;
    while (k < same.length && same[k] <= i) k++;
    seen.set(length, k);
    if (k === same.length) continue; // never closed: the backticks are text
    const [closeAt] = ticks[same[k]];
    hide(at, at + length);
    fix(at + length, closeAt);
    hide(closeAt, closeAt + length);
    styles.push([at + length, closeAt, "code"]);
    i = same[k];
  }
  for (let at = s.indexOf("<!--"); at >= 0; at = s.indexOf("<!--", at)) {
    const end = s.indexOf("-->", at + 4);
    if (end < 0) break; // nothing after closes a comment either
    if (free(at, end + 3)) hide(at, end + 3);
    at = end + 3;
  }
  for (const m of s.matchAll(ESCAPE)) {
    if (!free(m.index, m.index + 2)) continue;
    hide(m.index, m.index + 1);
    fix(m.index + 1, m.index + 2);
  }
  const breaks = []; // where a <br> stands: a line break, shown as one
  for (const m of s.matchAll(TAG)) {
    if (!free(m.index, m.index + m[0].length)) continue;
    hide(m.index, m.index + m[0].length);
    if (/^<br\b/i.test(m[0])) breaks.push(pos[m.index]);
  }
  for (const m of s.matchAll(LINK)) {
    const a = m.index;
    const label = a + m[1].length + 1;
    const labelEnd = label + m[2].length;
    if (!free(a, label) || !free(labelEnd, a + m[0].length)) continue;
    hide(a, label);
    hide(labelEnd, a + m[0].length);
    styles.push([label, labelEnd, "link"]);
  }
  for (const m of s.matchAll(STRIKE)) {
    const a = m.index;
    const b = a + m[0].length;
    if (!free(a, a + 2) || !free(b - 2, b)) continue;
    hide(a, a + 2);
    hide(b - 2, b);
    styles.push([a + 2, b - 2, "del"]);
  }
  emphasis(s, hidden, fixed, styles);

  const starting = new Map(); // offset -> the styles that start there; likewise ending
  const ending = new Map();
  const at = (map, k) => map.get(k) || map.set(k, []).get(k);
  for (const [a, b, mark] of styles) {
    if (b <= a) continue;
    at(starting, a).push(mark);
    at(ending, b).push(mark);
  }
  const depth = { strong: 0, em: 0, code: 0, del: 0, link: 0 };
  const runs = [];
  for (let k = 0; k < n; k++) {
    for (const mark of ending.get(k) || []) depth[mark] -= 1;
    for (const mark of starting.get(k) || []) depth[mark] += 1;
    if (hidden[k]) continue;
    const marks = Object.keys(depth).filter((mark) => depth[mark] > 0);
    const key = marks.join(" ");
    const last = runs[runs.length - 1];
    if (last && last.key === key && last.end === pos[k] && last.next === k) {
      last.end += 1;
      last.next = k + 1;
    } else {
      runs.push({ start: pos[k], end: pos[k] + 1, marks, key, next: k + 1 });
    }
  }
  const out = [];
  const lineBreak = (at) => ({ start: at, end: at, marks: [], br: true });
  for (const { start, end, marks } of runs) {
    while (breaks.length && breaks[0] <= start) out.push(lineBreak(breaks.shift()));
    out.push({ start, end, marks });
  }
  return out.concat(breaks.map(lineBreak));
}

/** CommonMark's emphasis, in short: delimiter runs of * and _ that can open or close, matched innermost first. */
function emphasis(s, hidden, fixed, styles) {
  const runs = [];
  for (let k = 0; k < s.length;) {
    const c = s[k];
    if ((c !== "*" && c !== "_") || fixed[k]) {
      k++;
      continue;
    }
    let j = k;
    while (j < s.length && s[j] === c && !fixed[j]) j++;
    const before = k > 0 ? s[k - 1] : " ";
    const after = j < s.length ? s[j] : " ";
    const space = (ch) => /\s/.test(ch);
    const punct = (ch) => PUNCT.test(ch);
    const left = !space(after) && (!punct(after) || space(before) || punct(before));
    const right = !space(before) && (!punct(before) || space(after) || punct(after));
    const open = c === "*" ? left : left && (!right || punct(before));
    const close = c === "*" ? right : right && (!left || punct(after));
    runs.push({ c, start: k, end: j, count: j - k, open, close, both: open && close, length: j - k });
    k = j;
  }
  const openers = [];
  for (const closer of runs) {
    while (closer.close && closer.count > 0) {
      let found = -1;
      for (let o = openers.length - 1; o >= Math.max(0, openers.length - LOOKBACK); o--) {
        const opener = openers[o];
        if (opener.c !== closer.c || opener.count === 0) continue;
        if ((opener.both || closer.both) && (opener.length + closer.length) % 3 === 0
            && (opener.length % 3 !== 0 || closer.length % 3 !== 0)) continue;
        found = o;
        break;
      }
      if (found < 0) break;
      const opener = openers[found];
      const use = opener.count >= 2 && closer.count >= 2 ? 2 : 1;
      const openAt = opener.start + opener.count - use; // an opener gives up its innermost delimiters
      const closeAt = closer.end - closer.count;
      for (let k = openAt; k < openAt + use; k++) hidden[k] = 1;
      for (let k = closeAt; k < closeAt + use; k++) hidden[k] = 1;
      styles.push([openAt + use, closeAt, use === 2 ? "strong" : "em"]);
      opener.count -= use;
      closer.count -= use;
      openers.length = opener.count > 0 ? found + 1 : found; // openers in between can no longer match
    }
    if (closer.open && closer.count > 0) openers.push(closer);
  }
}
