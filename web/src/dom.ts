// The dashboard's only way to make DOM: elements built with createElement,
// data put in as text nodes (never parsed as HTML: nothing a miner reports
// about itself can become markup or script), attributes from a short list,
// links to this page's own routes only, and listeners as functions.

export type Child = Node | string | number | null | undefined | false | Child[];

export interface Attrs {
  class?: string;
  title?: string;
  /** a route of this page (`#/…`) or a path of this server (`/…`); anything else is dropped */
  href?: string;
  id?: string;
  /** for tests and styling: `data-<key>` attributes */
  data?: Record<string, string>;
  type?: string;
  disabled?: boolean;
  download?: string;
  colspan?: number;
  on?: { [K in keyof HTMLElementEventMap]?: (e: HTMLElementEventMap[K]) => void };
}

const SAFE_HREF = /^(#|\/(?!\/))/;

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs | null = null, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (attrs) {
    if (attrs.class) el.className = attrs.class;
    if (attrs.title !== undefined) el.title = attrs.title;
    if (attrs.id) el.id = attrs.id;
    if (attrs.href !== undefined && SAFE_HREF.test(attrs.href)) el.setAttribute('href', attrs.href);
    if (attrs.type) el.setAttribute('type', attrs.type);
    if (attrs.disabled) el.setAttribute('disabled', '');
    if (attrs.download !== undefined) el.setAttribute('download', attrs.download);
    if (attrs.colspan !== undefined) el.setAttribute('colspan', String(attrs.colspan));
    for (const [k, v] of Object.entries(attrs.data ?? {})) if (/^[a-z][a-z0-9-]*$/.test(k)) el.dataset[k.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase())] = v;
    for (const [name, fn] of Object.entries(attrs.on ?? {})) el.addEventListener(name, fn as EventListener);
  }
  append(el, children);
  return el;
}

/** Appends children: nodes as they are, everything else as text. */
export function append(parent: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(parent, c);
    else parent.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces an element's content. */
export function fill(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, children);
}

/** A table: a header row and a body row per item. */
export function table(headers: readonly string[], rows: readonly Child[][], attrs: Attrs = {}): HTMLTableElement {
  return h(
    'table',
    attrs,
    h('thead', null, h('tr', null, headers.map((x) => h('th', null, x)))),
    h('tbody', null, rows.length ? rows.map((r) => h('tr', null, r.map((c) => h('td', null, c)))) : h('tr', null, h('td', { class: 'empty', colspan: headers.length }, 'nothing yet'))),
  );
}

/** A status as a coloured badge. */
export function badge(status: string): HTMLSpanElement {
  return h('span', { class: `badge s-${status.replace(/[^a-z_]/g, '')}` }, status);
}
