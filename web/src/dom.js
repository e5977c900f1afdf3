// Building the page with DOM calls only. Every string the server sends is
// hostile: keys are whatever a client put in a header, policy names and
// error messages come from a config file. Text goes in as text nodes, and
// nothing is ever parsed as HTML (no innerHTML, no inline handlers, no
// style attributes: the page runs under a CSP without 'unsafe-inline').

// Attributes that could load or run something: never set from data.
const kForbidden = new Set(['href', 'src', 'srcdoc', 'action', 'formaction', 'style']);

// h('td', {class: 'num', dataset: {key}}, 'text', child, [more]): an element
// with attributes, listeners (onclick: fn) and children; strings become text
// nodes, null and undefined are skipped, arrays are flattened.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'class') {
      el.className = value;
    } else if (name === 'dataset') {
      for (const [k, v] of Object.entries(value)) el.dataset[k] = String(v);
    } else if (name.startsWith('on')) {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'value' || name === 'checked' || name === 'disabled' || name === 'selected') {
      el[name] = value;
    } else {
      if (kForbidden.has(name)) throw new Error('h(): attribute ' + name + ' is not allowed');
      el.setAttribute(name, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// Replaces the children of `el` (found by id when a string).
export function fill(el, ...children) {
  const target = typeof el === 'string' ? byId(el) : el;
  target.replaceChildren();
  append(target, children);
  return target;
}

export function byId(id) {
  const el = document.getElementById(id);
  if (!el) throw new Error('no element #' + id);
  return el;
}

// Sets textContent only when it changed (no layout work every second).
export function setText(el, text) {
  const s = String(text);
  if (el.textContent !== s) el.textContent = s;
}
