// The one query layer for SQLite and PostgreSQL: the stores write their SQL
// in SQLite's dialect, in the subset both engines run the same way, and this
// module translates it mechanically for PostgreSQL (docs/postgres.md). Pure:
// text in, text out, no connection.
//
// Translated: parameters (`?` in order, or `@name`) → `$n`; identifiers in
// camelCase (`AS minerId`, and every later use of them) quoted so PostgreSQL
// keeps their case; type names written in upper case (INTEGER → BIGINT,
// REAL → DOUBLE PRECISION, BLOB → BYTEA, TEXT → TEXT COLLATE "C" in DDL so
// text sorts by bytes as SQLite's BINARY does); `INTEGER PRIMARY KEY
// [AUTOINCREMENT]` → an identity column; every other table gets SQLite's
// implicit `rowid` as an explicit identity column (unless WITHOUT ROWID,
// which is dropped); `INSERT OR IGNORE` → `ON CONFLICT DO NOTHING`;
// `json_each(x)` → `json_array_elements_text(x::json)` (only `value` may be
// read); `json_extract(x, '$.key')` → `(x::json ->> 'key')` (as text);
// `instr` → `strpos`; two-or-more-argument MIN/MAX → LEAST/GREATEST (their
// arguments must not be NULL: SQLite gives NULL, PostgreSQL skips it);
// `LIMIT -1` → `LIMIT ALL`. Anything with no safe translation
// (`INSERT OR REPLACE`, `PRAGMA`, `GLOB`, a json_extract path that is not
// `$.key`) throws: the store's SQL must be written portably instead.
import { NimbleError } from '../../protocol/errors.ts';

/** A statement translated: its text and, for named parameters, the name of each `$n` (index n − 1). */
export interface Translated {
  text: string;
  /** null: positional parameters (`?`), bound in order */
  names: string[] | null;
  /** how many parameters it takes */
  params: number;
}

type Kind = 'space' | 'comment' | 'string' | 'quoted' | 'word' | 'number' | 'param' | 'named' | 'punct';
interface Token {
  kind: Kind;
  text: string;
}

/** Splits SQL into tokens; joining their texts gives back the input exactly. */
export function tokenize(sql: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  const n = sql.length;
  const take = (kind: Kind, end: number): void => {
    out.push({ kind, text: sql.slice(i, end) });
    i = end;
  };
  while (i < n) {
    const c = sql[i];
    if (/\s/.test(c)) {
      let j = i + 1;
      while (j < n && /\s/.test(sql[j])) j++;
      take('space', j);
    } else if (c === '-' && sql[i + 1] === '-') {
      const j = sql.indexOf('\n', i);
      take('comment', j < 0 ? n : j);
    } else if (c === '/' && sql[i + 1] === '*') {
      const j = sql.indexOf('*/', i + 2);
      take('comment', j < 0 ? n : j + 2);
    } else if (c === "'" || c === '"' || c === '`') {
      // a quote doubled inside is an escaped quote
      let j = i + 1;
      for (;;) {
        if (j >= n) throw new NimbleError('invalid', `unterminated ${c} in SQL: ${sql.slice(0, 80)}`);
        if (sql[j] === c) {
          if (sql[j + 1] === c) j += 2;
          else break;
        } else j++;
      }
      take(c === "'" ? 'string' : 'quoted', j + 1);
    } else if (/[A-Za-z_]/.test(c)) {
      let j = i + 1;
      while (j < n && /[A-Za-z0-9_$]/.test(sql[j])) j++;
      take('word', j);
    } else if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(sql[i + 1] ?? ''))) {
      let j = i + 1;
      while (j < n && /[0-9.eE]/.test(sql[j])) j++;
      take('number', j);
    } else if (c === '?') {
      let j = i + 1;
      while (j < n && /[0-9]/.test(sql[j])) j++;
      if (j > i + 1) throw new NimbleError('invalid', `numbered parameters (?NNN) are not supported: ${sql.slice(0, 80)}`);
      take('param', j);
    } else if ((c === '@' || c === ':' || c === '$') && /[A-Za-z_]/.test(sql[i + 1] ?? '')) {
      let j = i + 1;
      while (j < n && /[A-Za-z0-9_]/.test(sql[j])) j++;
      take('named', j);
    } else {
      // two-character operators stay together (::, ||, !=, <>, <=, >=, ->)
      const two = sql.slice(i, i + 2);
      take('punct', ['::', '||', '!=', '<>', '<=', '>=', '->'].includes(two) ? i + 2 : i + 1);
    }
  }
  return out;
}

const CAMEL = /^[a-z][a-z0-9_]*[A-Z][A-Za-z0-9_]*$/;
const unsupported = (what: string, sql: string): NimbleError =>
  new NimbleError('invalid', `${what} has no PostgreSQL translation; write it portably: ${sql.replace(/\s+/g, ' ').trim().slice(0, 80)}`);

/** Index of the token after the one closing the parenthesis opened at `open`. */
function closing(t: readonly Token[], open: number): number {
  let depth = 0;
  for (let k = open; k < t.length; k++) {
    if (t[k].text === '(') depth++;
    else if (t[k].text === ')' && --depth === 0) return k;
  }
  throw new NimbleError('invalid', 'unbalanced parentheses in SQL');
}

/** The next token that is not space or comment, from k on. */
function next(t: readonly Token[], k: number): number {
  while (k < t.length && (t[k].kind === 'space' || t[k].kind === 'comment')) k++;
  return k;
}

const isWord = (tok: Token | undefined, w: string): boolean => tok?.kind === 'word' && tok.text.toUpperCase() === w;

/** Translates one SQL text (one statement, or a script of several) from SQLite's dialect to PostgreSQL's. */
export function toPostgres(sql: string): Translated {
  const t = tokenize(sql);
  const out: string[] = [];
  let positional = 0;
  const names: string[] = [];
  // per statement: is it DDL (types translated), an INSERT OR IGNORE (ON CONFLICT appended)
  let ddl = false;
  let ignore = false;
  let createTable: { integerKey: boolean; withoutRowid: boolean } | null = null;
  let depth = 0;
  const endStatement = (): void => {
    if (ignore) out.push(' ON CONFLICT DO NOTHING');
    ddl = false;
    ignore = false;
  };
  // a statement starts at the beginning and after each top-level ';'
  let start = true;
  for (let k = 0; k < t.length; k++) {
    const tok = t[k];
    if (tok.kind === 'space' || tok.kind === 'comment') {
      out.push(tok.text);
      continue;
    }
    if (start && tok.kind === 'word') {
      const up = tok.text.toUpperCase();
      ddl = up === 'CREATE' || up === 'ALTER';
      if (up === 'PRAGMA') throw unsupported('PRAGMA', sql);
      if (up === 'CREATE' && isWord(t[next(t, k + 1)], 'TABLE')) createTable = { integerKey: false, withoutRowid: false };
    }
    start = false;
    switch (tok.kind) {
      case 'param':
        if (names.length) throw new NimbleError('invalid', `SQL mixes ? and named parameters: ${sql.slice(0, 80)}`);
        out.push(`$${++positional}`);
        continue;
      case 'named': {
        if (positional) throw new NimbleError('invalid', `SQL mixes ? and named parameters: ${sql.slice(0, 80)}`);
        const name = tok.text.slice(1);
        let at = names.indexOf(name);
        if (at < 0) at = names.push(name) - 1;
        out.push(`$${at + 1}`);
        continue;
      }
      case 'punct':
        if (tok.text === '(') depth++;
        if (tok.text === ')') {
          depth--;
          // the end of CREATE TABLE's column list: SQLite's implicit rowid made explicit
          if (createTable && depth === 0 && !createTable.integerKey) {
            const after = next(t, k + 1);
            createTable.withoutRowid = isWord(t[after], 'WITHOUT') && isWord(t[next(t, after + 1)], 'ROWID');
            if (!createTable.withoutRowid) {
              // before the whitespace that precedes the ')'
              let at = out.length;
              while (at > 0 && /^\s*$/.test(out[at - 1])) at--;
              out.splice(at, 0, ', rowid BIGINT GENERATED ALWAYS AS IDENTITY');
            }
            createTable = null;
          }
        }
        if (tok.text === ';' && depth === 0) {
          endStatement();
          createTable = null;
          start = true;
        }
        out.push(tok.text);
        continue;
      case 'word':
        break;
      default:
        out.push(tok.text);
        continue;
    }
    // ---- words ----
    const w = tok.text;
    const up = w.toUpperCase();
    const after = next(t, k + 1);
    if (CAMEL.test(w)) {
      out.push(`"${w}"`);
      continue;
    }
    if (up === 'INSERT' && isWord(t[after], 'OR')) {
      const what = t[next(t, after + 1)];
      if (!isWord(what, 'IGNORE')) throw unsupported(`INSERT OR ${what?.text ?? ''}`, sql);
      ignore = true;
      out.push('INSERT');
      k = next(t, after + 1); // skip OR IGNORE
      continue;
    }
    if (up === 'RETURNING' && ignore && depth === 0) {
      out.push('ON CONFLICT DO NOTHING ');
      ignore = false;
    }
    if (up === 'GLOB' || up === 'PRAGMA' || w === 'json_remove' || w === 'json_set' || w === 'group_concat' || w === 'printf' || w === 'strftime' || w === 'iif') {
      throw unsupported(w, sql);
    }
    if (up === 'WITHOUT' && isWord(t[after], 'ROWID')) {
      k = after; // dropped
      continue;
    }
    if (w === 'INTEGER' && isWord(t[after], 'PRIMARY') && isWord(t[next(t, after + 1)], 'KEY')) {
      // an alias of SQLite's rowid: numbered automatically
      let end = next(t, after + 1);
      const auto = next(t, end + 1);
      if (isWord(t[auto], 'AUTOINCREMENT')) end = auto;
      if (createTable) createTable.integerKey = true;
      out.push('BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY');
      k = end;
      continue;
    }
    if (w === 'INTEGER') {
      out.push('BIGINT');
      continue;
    }
    if (w === 'REAL') {
      out.push('DOUBLE PRECISION');
      continue;
    }
    if (w === 'BLOB') {
      out.push('BYTEA');
      continue;
    }
    if (w === 'TEXT' && ddl) {
      out.push('TEXT COLLATE "C"');
      continue;
    }
    if (up === 'LIMIT' && t[after]?.text === '-' && t[after + 1]?.text === '1') {
      out.push('LIMIT ALL');
      k = after + 1;
      continue;
    }
    if (t[after]?.text === '(' && (w === 'json_each' || w === 'json_extract' || up === 'MAX' || up === 'MIN' || w === 'instr')) {
      const close = closing(t, after);
      const inner = t.slice(after + 1, close);
      const args = splitArgs(inner);
      const sub = (toks: readonly Token[]): string => {
        const r = toPostgresTokens(toks, positional, names);
        positional = r.positional;
        return r.text;
      };
      if (w === 'json_each') {
        if (args.length !== 1) throw unsupported('json_each with a root path', sql);
        out.push(`json_array_elements_text((${sub(args[0])})::json)`);
      } else if (w === 'json_extract') {
        const path = args.length === 2 ? args[1].filter((x) => x.kind !== 'space') : [];
        const m = path.length === 1 && path[0].kind === 'string' ? /^'\$\.([A-Za-z_][A-Za-z0-9_]*)'$/.exec(path[0].text) : null;
        if (!m) throw unsupported('json_extract with a path other than $.key', sql);
        out.push(`((${sub(args[0])})::json ->> '${m[1]}')`);
      } else if (w === 'instr') {
        out.push(`strpos(${sub(inner)})`);
      } else {
        // MIN/MAX: an aggregate with one argument, a scalar with more
        const name = args.length >= 2 ? (up === 'MAX' ? 'GREATEST' : 'LEAST') : w;
        out.push(`${name}(${sub(inner)})`);
      }
      k = close;
      continue;
    }
    out.push(w);
  }
  endStatement();
  if (positional && names.length) throw new NimbleError('invalid', `SQL mixes ? and named parameters: ${sql.slice(0, 80)}`);
  return { text: out.join(''), names: names.length ? names : null, params: names.length || positional };
}

/** Translates a run of tokens inside a function call, numbering its parameters after `positional`. */
function toPostgresTokens(toks: readonly Token[], positional: number, names: string[]): { text: string; positional: number } {
  const text = toks.map((x) => x.text).join('');
  const r = toPostgres(text);
  // renumber the inner statement's parameters after the ones already taken
  if (r.names) {
    const mapped = r.text.replace(/\$(\d+)/g, (_, d: string) => {
      const name = r.names![Number(d) - 1];
      let at = names.indexOf(name);
      if (at < 0) at = names.push(name) - 1;
      return `$${at + 1}`;
    });
    return { text: mapped, positional };
  }
  return { text: r.text.replace(/\$(\d+)/g, (_, d: string) => `$${positional + Number(d)}`), positional: positional + r.params };
}

/** Splits a function's argument tokens at its top-level commas. */
function splitArgs(toks: readonly Token[]): Token[][] {
  const args: Token[][] = [[]];
  let depth = 0;
  for (const x of toks) {
    if (x.text === '(') depth++;
    if (x.text === ')') depth--;
    if (x.text === ',' && depth === 0) args.push([]);
    else args[args.length - 1].push(x);
  }
  return args.length === 1 && args[0].every((x) => x.kind === 'space') ? [] : args;
}

/** The values of a statement's parameters in `$n` order: positional ones as given, named ones picked by name. */
export function bindings(tr: Translated, params: readonly unknown[]): unknown[] {
  if (tr.names === null) {
    if (params.length === 1 && isRecord(params[0])) throw new NimbleError('invalid', 'named values given to a statement with ? parameters');
    if (params.length !== tr.params) throw new NimbleError('invalid', `the statement takes ${tr.params} values, ${params.length} given: ${tr.text.slice(0, 80)}`);
    return [...params];
  }
  const values = params[0];
  if (params.length !== 1 || !isRecord(values)) throw new NimbleError('invalid', `the statement takes named values (${tr.names.join(', ')})`);
  return tr.names.map((name) => {
    if (!(name in values)) throw new NimbleError('invalid', `missing named parameter ${name}`);
    return values[name];
  });
}

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Uint8Array);
