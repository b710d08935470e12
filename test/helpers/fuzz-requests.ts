// Random malformed requests for the fuzz tests (test/network/fuzz.test.ts,
// test/miner/peer-api-fuzz.test.ts), drawn from a seeded PRNG and from each
// route's own declared schemas (routesOf in src/http/server.ts), so a new
// route is fuzzed without being listed here: path params and query strings
// sampled from their schemas or replaced by garbage, JSON bodies sampled then
// mutated (wrong types, absurd numbers, missing and extra fields, broken JSON
// text), binary bodies as tensor frames truncated and corrupted, wrong content
// types, oversized bodies, and every way a signature can be missing, forged,
// stale, replayed or for another network, or valid (a joined attacker's), so
// that fuzzed bodies reach validation. Plus raw bytes that are not quite HTTP.
import type { TSchema } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { CreateRunRequest } from '../../src/api/schemas.ts';
import type { RouteSummary } from '../../src/http/server.ts';
import { encodeFrame } from '../../src/protocol/frame.ts';
import { JoinRequest } from '../../src/protocol/messages.ts';
import { AUTH_HEADERS, type RequestSigner } from '../../src/protocol/signing.ts';

/** A uniform number in [0, 1). */
export type Rng = () => number;

/** sfc32 seeded by splitmix32: the whole request sequence follows from one 32-bit seed. */
export function prng(seed: number): Rng {
  let s = seed >>> 0;
  const split = (): number => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
  let a = split(), b = split(), c = split(), d = split();
  return () => {
    const t = (((a + b) >>> 0) + d) >>> 0;
    d = (d + 1) >>> 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) >>> 0;
    c = ((c << 21) | (c >>> 11)) >>> 0;
    c = (c + t) >>> 0;
    return t / 4294967296;
  };
}

const int = (rng: Rng, lo: number, hi: number): number => lo + Math.floor(rng() * (hi - lo + 1));
const pick = <T>(rng: Rng, xs: readonly T[]): T => xs[Math.floor(rng() * xs.length)];
const chance = (rng: Rng, p: number): boolean => rng() < p;
const hex = (rng: Rng, n: number): string => Array.from({ length: n }, () => '0123456789abcdef'[int(rng, 0, 15)]).join('');
const B64U = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
const b64u = (rng: Rng, n: number): string => Array.from({ length: n }, () => B64U[int(rng, 0, 63)]).join('');
const bytes = (rng: Rng, n: number): Uint8Array => Uint8Array.from({ length: n }, () => int(rng, 0, 255));
/** Picks a key by weight. */
function weighted<K extends string>(rng: Rng, w: Record<K, number>): K {
  const entries = Object.entries(w) as [K, number][];
  let r = rng() * entries.reduce((a, [, x]) => a + x, 0);
  for (const [k, x] of entries) if ((r -= x) < 0) return k;
  return entries[0][0];
}

/** The keys the fuzz signs with. */
export interface FuzzKeys {
  /** the attacker's wallet and the session key it bound when it joined: valid signatures that get past auth */
  wallet: RequestSigner;
  session: RequestSigner;
  sessionPublicKey: string;
  /** the same attacker signing for another network */
  foreignSession: RequestSigner;
  foreignWallet: RequestSigner;
  /** its clock five minutes behind, and five minutes ahead */
  staleSession: RequestSigner;
  futureSession: RequestSigner;
  /** a session key nobody bound */
  stranger: RequestSigner;
  /** an API key of the attacker's wallet: /v1/completions and /v1/chat/completions requests that get past the key check */
  apiKey: string;
  /** the Cookie header of an operator's dashboard session: /operator/* requests that get past the login */
  operatorCookie: string;
}

/** Names the fuzz uses where a value should look plausible (so requests get past the schemas). */
export interface FuzzWorld {
  runIds: string[];
  addresses: string[];
  /** jobs that exist (some the attacker's own, whose reads it sees whole) */
  jobIds?: string[];
}

/** One request to send. */
export interface FuzzRequest {
  /** which server, and which of its routes ("POST /miners/heartbeat", "(unknown)", "(raw)") */
  target: string;
  route: string;
  /** what was done to it */
  kind: string[];
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: Uint8Array;
  /** a content-length beyond the bytes sent: an oversized body, to be refused from its headers */
  announce?: number;
  /** raw bytes on a fresh connection instead of an HTTP request */
  raw?: Uint8Array;
}

// ---- values ------------------------------------------------------------------

const ADDRESS = '^0x[0-9a-fA-F]{40}$';
const SHA = '^[0-9a-f]{64}$';
const ID = '^[A-Za-z0-9_.:-]+$';
const JOB_ID = '^job-[0-9a-f]{16}$';
const JOB_CURSOR = '^[0-9]{1,16}\\.job-[0-9a-f]{16}$';

/** A value of `schema`, mostly valid and plausible (known run ids and addresses, small counts). */
export function sample(rng: Rng, schema: TSchema, world: FuzzWorld): unknown {
  const s = schema as Record<string, unknown> & TSchema;
  if ('const' in s) return s.const;
  if (Array.isArray(s.anyOf)) return sample(rng, pick(rng, s.anyOf as TSchema[]), world);
  switch (s.type) {
    case 'object': {
      const o: Record<string, unknown> = {};
      const required = (s.required as string[] | undefined) ?? [];
      for (const [k, p] of Object.entries((s.properties as Record<string, TSchema>) ?? {})) if (required.includes(k) || chance(rng, 0.5)) o[k] = sample(rng, p, world);
      return o;
    }
    case 'array': {
      if (Array.isArray(s.items)) return (s.items as TSchema[]).map((i) => sample(rng, i, world));
      const n = int(rng, (s.minItems as number | undefined) ?? 0, Math.min((s.maxItems as number | undefined) ?? 3, 3));
      return Array.from({ length: n }, () => sample(rng, s.items as TSchema, world));
    }
    case 'integer':
    case 'number': {
      const lo = (s.minimum as number | undefined) ?? ((s.exclusiveMinimum as number | undefined) ?? -10) + (s.type === 'integer' ? 1 : 1e-3);
      const hi = (s.maximum as number | undefined) ?? ((s.exclusiveMaximum as number | undefined) ?? lo + 1000) - (s.type === 'integer' ? 1 : 1e-3);
      const small = Math.min(hi, lo + (s.type === 'integer' ? int(rng, 0, 40) : rng() * 10));
      return pick(rng, [lo, small, small, small, hi]);
    }
    case 'boolean':
      return chance(rng, 0.5);
    case 'null':
      return null;
    case 'Uint8Array':
      return bytes(rng, 16);
    case 'string':
      return sampleString(rng, s, world);
    default:
      return null;
  }
}

function sampleString(rng: Rng, s: Record<string, unknown>, world: FuzzWorld): string {
  const pattern = s.pattern as string | undefined;
  if (pattern === ADDRESS) return chance(rng, 0.7) && world.addresses.length ? pick(rng, world.addresses) : `0x${hex(rng, 40)}`;
  if (pattern === SHA) return hex(rng, 64);
  if (pattern === ID) return chance(rng, 0.8) && world.runIds.length ? pick(rng, world.runIds) : `run-${hex(rng, 8)}`;
  if (pattern === JOB_ID) return chance(rng, 0.8) && world.jobIds?.length ? pick(rng, world.jobIds) : `job-${hex(rng, 16)}`;
  if (pattern === JOB_CURSOR) return `${int(rng, 0, 2 ** 40)}.${chance(rng, 0.5) && world.jobIds?.length ? pick(rng, world.jobIds) : `job-${hex(rng, 16)}`}`;
  if (pattern?.startsWith('^https?://')) return pick(rng, ['http://127.0.0.1:9', 'http://127.0.0.1:9/x', 'https://localhost:1/']);
  if (pattern === '^[A-Za-z0-9_-]{43}$') return b64u(rng, 43);
  if (pattern === '^[A-Za-z0-9_-]{86}$') return b64u(rng, 86);
  if (pattern === '^[0-9a-f]{32,128}$') return hex(rng, 32);
  const min = (s.minLength as number | undefined) ?? 0;
  const max = Math.min((s.maxLength as number | undefined) ?? 24, 24);
  return Array.from({ length: int(rng, Math.min(min, max), Math.max(min, max)) }, () => String.fromCharCode(int(rng, 0x20, 0x7e))).join('');
}

/** Values a schema should refuse somewhere, and some it may accept: wrong types, absurd numbers, odd strings. */
const BAD_VALUES: readonly unknown[] = [
  null, true, false, 0, -1, -0.5, 1.5, 1e308, -1e308, 2 ** 53, 2 ** 53 + 2, -(2 ** 53), 2 ** 31, 2 ** 31 - 1, 2 ** 32, 5e-324,
  '', ' ', '0', '-1', '1e308', 'NaN', 'Infinity', 'null', 'true', '0x10', [], {}, [null], [1, 2, 3], { a: 1 },
  'a'.repeat(5000), '\u0000', '\ud800', '\u202e', '../../etc/passwd', '<script>', "' OR 1=1 --", 'ünïcødé 🚀',
];
/** One of BAD_VALUES, copied (the fuzz changes what it puts in a body). */
const badValue = (rng: Rng): unknown => structuredClone(pick(rng, BAD_VALUES));
const EXTRA_KEYS = ['x', 'extra', 'constructor', 'prototype', 'toString', 'hasOwnProperty', 'valueOf', 'then'];

/** Every (container, key) in a JSON value, root first. */
function slots(v: unknown, out: { parent: Record<string, unknown> | unknown[]; key: string | number }[] = []): typeof out {
  const entries: [string | number, unknown][] = Array.isArray(v) ? v.map((x, i) => [i, x]) : v && typeof v === 'object' ? Object.entries(v) : [];
  for (const [key, x] of entries) {
    out.push({ parent: v as Record<string, unknown> | unknown[], key });
    slots(x, out);
  }
  return out;
}

/** `value` (a copy) with one to three things wrong with it; the names of what was done go to `kind`. */
export function mutate(rng: Rng, value: unknown, kind: string[]): unknown {
  const root = { v: structuredClone(value) as unknown };
  for (let n = int(rng, 1, 3); n > 0; n--) {
    const all = [{ parent: root as unknown as Record<string, unknown>, key: 'v' }, ...slots(root.v)];
    const { parent, key } = pick(rng, all);
    const at = (parent as Record<string | number, unknown>)[key];
    const what = weighted(rng, { bad: 40, edge: 15, remove: 15, extra: 10, many: 5, long: 10, nest: 5 });
    kind.push(`json:${what}`);
    const set = (x: unknown): void => void ((parent as Record<string | number, unknown>)[key] = x);
    if (what === 'bad') set(badValue(rng));
    else if (what === 'edge') set(typeof at === 'number' ? pick(rng, [at + 1, at - 1, -at, at * 2 ** 32, at + 0.5, Number.MAX_VALUE]) : badValue(rng));
    else if (what === 'remove') {
      if (Array.isArray(parent)) parent.splice(key as number, 1);
      else if (parent !== (root as unknown)) delete (parent as Record<string, unknown>)[key as string];
      else set(undefined);
    } else if (what === 'extra') {
      if (at && typeof at === 'object' && !Array.isArray(at)) (at as Record<string, unknown>)[pick(rng, EXTRA_KEYS)] = badValue(rng);
      else set({ [pick(rng, EXTRA_KEYS)]: at });
    } else if (what === 'many') {
      // many copies of something small (of nothing big: bodies stay within a few MB); copies, not one object many times
      // over, or a later mutation inside it would be repeated in every copy (20,000 × 20,000 slots filled the heap)
      const item = Array.isArray(at) && at.length ? at[0] : at;
      const small = (JSON.stringify(item) ?? '').length <= 64 && (JSON.stringify(root.v) ?? '').length < 1 << 16;
      set(Array.from({ length: pick(rng, [4097, 5000, 20_000]) }, () => (small ? structuredClone(item ?? 0) : 0)));
    }
    else if (what === 'long') set('x'.repeat(pick(rng, [65, 129, 257, 1025, 100_000])));
    else set(JSON.parse('['.repeat(200) + ']'.repeat(200)));
  }
  return root.v;
}

/** JSON text of `value`, sometimes broken on purpose. */
export function serialize(rng: Rng, value: unknown, kind: string[]): Uint8Array {
  let text = value === undefined ? '' : JSON.stringify(value);
  if (!chance(rng, 0.25)) return new TextEncoder().encode(text);
  const what = weighted(rng, { truncate: 20, garbage: 10, proto: 10, numbers: 15, bom: 5, utf8: 10, deep: 5, dupKeys: 10, trailing: 5, nan: 5, empty: 5 });
  kind.push(`text:${what}`);
  if (what === 'truncate') text = text.slice(0, int(rng, 0, Math.max(0, text.length - 1)));
  else if (what === 'garbage') {
    const i = int(rng, 0, text.length);
    text = text.slice(0, i) + pick(rng, ['\u0000', '"', '\\', '}', ',', '\ud800', '\\u00', 'undefined']) + text.slice(i);
  } else if (what === 'proto') text = text.startsWith('{') ? `{"__proto__":{"polluted":1,"freeSlots":1},"constructor":{"prototype":{"x":1}}${text.length > 2 ? ',' : ''}${text.slice(1)}` : '{"__proto__":{"polluted":1}}';
  else if (what === 'numbers') text = text.replace(/-?\d+(\.\d+)?/g, () => pick(rng, ['1e999', '-1e999', '-0', '00012', '1E+400', '123456789012345678901234567890', '4.9e-325', '0.1e-999999']));
  else if (what === 'bom') text = `\ufeff${text}`;
  else if (what === 'utf8') return Uint8Array.from([...new TextEncoder().encode(text.slice(0, text.length >> 1)), 0xff, 0xfe, 0xc3, ...new TextEncoder().encode(text.slice(text.length >> 1))]);
  else if (what === 'deep') text = '['.repeat(100_000) + ']'.repeat(100_000);
  else if (what === 'dupKeys') text = text.replace(/^\{"([^"]+)":/, (m, k: string) => `{"${k}":"dup","${k}":[],"${k}":`);
  else if (what === 'trailing') text += pick(rng, ['}', ']]]', ' x', '\n{}', '\u0000']);
  else if (what === 'nan') text = text.replace(/-?\d+(\.\d+)?/, pick(rng, ['NaN', 'Infinity', '-Infinity', 'undefined']));
  else text = pick(rng, ['', ' ', 'null', '""', '[]', '0', 'true']);
  return new TextEncoder().encode(text);
}

// ---- binary bodies ------------------------------------------------------------

/** A frame laid out by hand from any header object (no checks), the header padded so the payload starts at a multiple of 8. */
export function craftFrame(header: unknown, payload: Uint8Array, version = 1): Uint8Array {
  let json = JSON.stringify(header) ?? "null";
  while ((12 + Buffer.byteLength(json)) % 8) json += ' ';
  const h = Buffer.from(json);
  const out = new Uint8Array(12 + h.length + payload.length);
  out.set([0x4e, 0x49, 0x4d, 0x46, version, 0, 0, 0]);
  new DataView(out.buffer).setUint32(8, h.length, true);
  out.set(h, 12);
  out.set(payload, 12 + h.length);
  return out;
}

/** A tensor frame, a check bundle or a safetensors file, valid or (mostly) broken. */
function binaryBody(rng: Rng, world: FuzzWorld, kind: string[]): Uint8Array {
  const activation = chance(rng, 0.4);
  const shape = activation ? [32, 16] : pick(rng, [[0], [1], [7], [4, 4], [2, 3, 2]]);
  const n = shape.reduce((a, b) => a * b, 1);
  const values = Float32Array.from({ length: n }, () => rng() * 4 - 2);
  if (n > 0 && chance(rng, 0.1)) values[int(rng, 0, n - 1)] = pick(rng, [1e5, -3e38, 65520, 1e-45]);
  const plausible = { runId: pick(rng, world.runIds.length ? world.runIds : ['run-x']), microbatch: int(rng, 1, 50), attempt: 1, shard: int(rng, 0, 9), step: 0, stage: int(rng, 0, 1), ticket: b64u(rng, 86) };
  const meta = chance(rng, 0.7) ? ((chance(rng, 0.5) ? mutate(rng, plausible, kind) : plausible) as Record<string, never>) : undefined;
  const codec = pick(rng, ['f32', 'f16', 'int8-row', 'int8-block'] as const);
  let frame: Uint8Array;
  try {
    frame = encodeFrame(values, shape, codec, meta && typeof meta === 'object' && !Array.isArray(meta) ? meta : undefined);
  } catch {
    frame = encodeFrame(new Float32Array(n), shape, codec);
  }
  const what = weighted(rng, { valid: 20, truncate: 15, flip: 15, header: 25, hlen: 5, trailing: 5, random: 8, empty: 4, bundle: 6, safetensors: 7 });
  kind.push(`frame:${what}`);
  if (what === 'valid') return frame;
  if (what === 'truncate') return frame.subarray(0, int(rng, 0, frame.length - 1));
  if (what === 'flip') {
    const f = frame.slice();
    for (let i = int(rng, 1, 8); i > 0; i--) f[int(rng, 0, f.length - 1)] ^= 1 << int(rng, 0, 7);
    return f;
  }
  if (what === 'header') {
    const hlen = new DataView(frame.buffer, frame.byteOffset).getUint32(8, true);
    const header = JSON.parse(Buffer.from(frame.subarray(12, 12 + hlen)).toString()) as Record<string, unknown>;
    return craftFrame(mutate(rng, header, kind), frame.subarray(12 + hlen), chance(rng, 0.05) ? 2 : 1);
  }
  if (what === 'hlen') {
    const f = frame.slice();
    new DataView(f.buffer).setUint32(8, pick(rng, [0, 1, 0xffffffff, 0x7fffffff, f.length, f.length - 12, 1 << 20]), true);
    return f;
  }
  if (what === 'trailing') return Uint8Array.from([...frame, ...bytes(rng, int(rng, 1, 64))]);
  if (what === 'random') return bytes(rng, int(rng, 1, 2048));
  if (what === 'empty') return new Uint8Array(0);
  if (what === 'bundle') {
    // "NCHK" | u32 version | u32 len(weights) | u32 len(input) | u32 len(output) | frames
    const head = new Uint8Array(20);
    head.set([0x4e, 0x43, 0x48, 0x4b]);
    const dv = new DataView(head.buffer);
    dv.setUint32(4, pick(rng, [1, 1, 0, 2]), true);
    const lens = [frame.length, pick(rng, [0, frame.length, 0xffffffff]), pick(rng, [0, 7, frame.length])];
    lens.forEach((l, i) => dv.setUint32(8 + 4 * i, l, true));
    return Uint8Array.from([...head, ...frame, ...(lens[1] === frame.length ? frame : []), ...bytes(rng, int(rng, 0, 16))]);
  }
  // safetensors: u64 header length, JSON header, data
  const header = mutate(rng, { __metadata__: { from: '0', to: '1', step: '1' }, w: { dtype: 'F32', shape: [2, 2], data_offsets: [0, 16] } }, kind);
  const json = Buffer.from(JSON.stringify(header) ?? '');
  const out = new Uint8Array(8 + json.length + 16);
  new DataView(out.buffer).setBigUint64(0, chance(rng, 0.8) ? BigInt(json.length) : pick(rng, [0n, 2n ** 63n, 2n ** 32n, BigInt(json.length + 1)]), true);
  out.set(json, 8);
  return out;
}

// ---- requests ------------------------------------------------------------------

const GARBAGE_SEGMENTS = [
  '', '%00', '..', '%2e%2e%2f%2e%2e', 'a'.repeat(3000), '-1', '1e308', '9007199254740993', 'NaN', '0x10', '%20', '%zz', '%F0%9F%9A%80',
  '%3Cscript%3E', '__proto__', 'constructor', '1.5', '+1', '00001', '%25', ';', '*', '~', `run-${'x'.repeat(200)}`, '%C0%AE', '%ff',
];
const GARBAGE_QUERIES = [
  'a=1', 'samples=1&samples=2', 'samples[]=1', 'samples=-1', 'samples=1e308', 'samples=NaN', 'samples=2e0', '__proto__[x]=1', 'constructor[prototype][x]=1',
  `${'x'.repeat(8000)}=1`, '%zz', '&&&', 'samples=', `challenge=${'f'.repeat(200)}`, 'challenge=ABC', 'challenge[]=00000000000000000000000000000000', '=', '?', 'a=%00',
];
const CONTENT_TYPES = [
  'text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/json; charset=latin1', 'application/json; charset=utf-16',
  'application/json, text/html', 'APPLICATION/JSON', 'application/octet-stream', 'application/json', `application/${'x'.repeat(2000)}`, ';', 'application/',
];
const METHODS = ['PUT', 'DELETE', 'PATCH', 'OPTIONS', 'GET', 'POST', 'HEAD'];

/** Percent-encoded UTF-8 (a lone surrogate is sent as U+FFFD). */
const encode = (s: string): string => [...Buffer.from(s, 'utf8')].map((b) => (/[A-Za-z0-9_.~-]/.test(String.fromCharCode(b)) ? String.fromCharCode(b) : `%${b.toString(16).padStart(2, '0').toUpperCase()}`)).join('');

/** Fills a route's `:params` from its params schema, or with garbage. */
function fillPath(rng: Rng, route: RouteSummary, world: FuzzWorld, kind: string[]): string {
  const props = ((route.params as Record<string, unknown> | undefined)?.properties as Record<string, TSchema> | undefined) ?? {};
  const names = [...route.url.matchAll(/:(\w+)/g)].map((m) => m[1]);
  const broken = names.length > 0 && chance(rng, 0.25) ? pick(rng, names) : null;
  return route.url.replace(/:(\w+)/g, (_, name: string) => {
    if (name === broken) {
      kind.push(`param:${name}`);
      return pick(rng, GARBAGE_SEGMENTS);
    }
    return encode(String(props[name] ? sample(rng, props[name], world) : 'x'));
  });
}

/** The query string: sampled from the route's schema, maybe broken, maybe junk on a route that takes none. */
function fillQuery(rng: Rng, route: RouteSummary, world: FuzzWorld, kind: string[]): string {
  if (chance(rng, 0.12)) {
    kind.push('query:garbage');
    return `?${pick(rng, GARBAGE_QUERIES)}`;
  }
  if (!route.querystring) return '';
  let q = sample(rng, route.querystring, world) as Record<string, unknown>;
  if (chance(rng, 0.3)) q = mutate(rng, q, kind) as Record<string, unknown>;
  if (!q || typeof q !== 'object' || Array.isArray(q)) return '';
  return `?${Object.entries(q).map(([k, v]) => `${encode(k)}=${encode(typeof v === 'string' ? v : JSON.stringify(v) ?? '')}`).join('&')}`;
}

const BAD_HEADER_VALUES: Record<string, string[]> = {
  [AUTH_HEADERS.address]: ['nope', `0x${'g'.repeat(40)}`, `0x${'a'.repeat(41)}`, '0x', ''],
  [AUTH_HEADERS.timestamp]: ['-1', '1e308', '9'.repeat(17), '0x10', 'NaN', '0', ''],
  [AUTH_HEADERS.nonce]: ['ZZ', 'a'.repeat(65), 'A'.repeat(32), '', '0'],
  [AUTH_HEADERS.contentSha256]: ['x', 'A'.repeat(64), '0'.repeat(63), ''],
  [AUTH_HEADERS.signature]: [`ed25519.${'!'.repeat(86)}`, 'ed25519.', `0x${'0'.repeat(130)}`, `0x${'f'.repeat(130)}`, 'x', ''],
};

/** Signature headers for `method path body` on `route`, done right or (mostly) wrong; `replay` asks for the request to be sent twice. */
async function sign(rng: Rng, keys: FuzzKeys, route: RouteSummary, method: string, path: string, body: Uint8Array | undefined, kind: string[]): Promise<{ headers: Record<string, string>; replay: boolean }> {
  // a route that may be signed (a public view that shows more to its party) takes either key, or none
  const optionalWallet = route.mayBeSigned && chance(rng, 0.5);
  const own = route.signed === 'wallet' || optionalWallet ? keys.wallet : keys.session;
  const how = route.signed
    ? weighted(rng, { valid: 42, none: 8, forged: 8, tampered: 5, otherBody: 5, otherPath: 4, stale: 5, future: 3, foreign: 5, wrongScheme: 4, stranger: 3, badHeader: 5, replay: 3 })
    : route.mayBeSigned
      ? weighted(rng, { none: 40, valid: 30, forged: 6, tampered: 4, stale: 4, foreign: 4, stranger: 3, badHeader: 6, replay: 3 })
      : weighted(rng, { none: 85, valid: 5, forged: 5, badHeader: 5 });
  kind.push(`auth:${how}`);
  const signer =
    how === 'stale' ? keys.staleSession
    : how === 'future' ? keys.futureSession
    : how === 'foreign' ? (route.signed === 'wallet' || optionalWallet ? keys.foreignWallet : keys.foreignSession)
    : how === 'wrongScheme' ? (route.signed === 'wallet' ? keys.session : keys.wallet)
    : how === 'stranger' ? keys.stranger
    : own;
  if (how === 'none') return { headers: {}, replay: false };
  // every draw is made before signing (which waits), so that requests made concurrently follow the seed in the order they were asked for
  const forgedSignature = chance(rng, 0.5) ? `ed25519.${b64u(rng, 86)}` : `0x${hex(rng, 130)}`;
  const tamperAt = rng();
  const badName = pick(rng, Object.keys(BAD_HEADER_VALUES));
  const badValue = pick(rng, BAD_HEADER_VALUES[badName]);
  const signedBody = how === 'otherBody' ? Uint8Array.from([...(body ?? []), 0x20]) : body;
  const signedPath = how === 'otherPath' ? `${path}${path.includes('?') ? '&' : '?'}x=1` : path;
  const headers: Record<string, string> = { ...(await signer.sign(method, signedPath.replace(/[^\x21-\x7e]/g, ''), signedBody)) };
  if (how === 'forged') headers[AUTH_HEADERS.signature] = forgedSignature;
  if (how === 'tampered') {
    const s = headers[AUTH_HEADERS.signature];
    const i = 10 + Math.floor(tamperAt * (s.length - 12));
    headers[AUTH_HEADERS.signature] = s.slice(0, i) + (s[i] === 'A' ? 'B' : 'A') + s.slice(i + 1);
  }
  if (how === 'badHeader') {
    if (badValue === '') delete headers[badName];
    else headers[badName] = badValue;
  }
  return { headers, replay: how === 'replay' };
}

/**
 * One or two requests (a replay is sent twice) for `route` of the server at
 * `target`. Every random draw happens before the first await, so calls made
 * one after another without waiting draw the same values for the same seed.
 */
export async function fuzzRoute(rng: Rng, target: string, route: RouteSummary, keys: FuzzKeys, world: FuzzWorld): Promise<FuzzRequest[]> {
  const kind: string[] = [];
  let method = route.method;
  if (chance(rng, 0.03)) {
    method = pick(rng, METHODS.filter((m) => m !== route.method));
    kind.push(`method:${method}`);
  }
  let path = fillPath(rng, route, world, kind) + fillQuery(rng, route, world, kind);
  // the operator may cancel anything: with its session the fuzz acts only on runs and jobs that do not exist
  if (route.url.startsWith('/operator/') && route.method === 'POST') for (const id of world.runIds) path = path.split(id).join(`run-${hex(rng, 8)}`);
  const hasBody = (method === 'POST' || method === 'PUT' || method === 'PATCH') ? true : chance(rng, 0.05);
  let body: Uint8Array | undefined;
  let contentType: string | undefined;
  let announce: number | undefined;
  const json = route.body !== undefined && (route.body as { type?: string }).type !== 'Uint8Array';
  if (hasBody) {
    if (json) {
      let value = route.body ? sample(rng, route.body, world) : {};
      if (chance(rng, 0.75)) value = mutate(rng, value, kind);
      value = keepHarmless(route, value, keys);
      body = serialize(rng, value, kind);
      contentType = 'application/json';
    } else {
      body = binaryBody(rng, world, kind);
      contentType = 'application/octet-stream';
    }
    if (chance(rng, 0.015)) {
      // a body over the route's limit: sent in full when small, announced and refused from the headers when large
      kind.push('oversized');
      if (route.bodyLimit <= 2 << 20) body = new TextEncoder().encode(`{"a":"${'x'.repeat(route.bodyLimit)}"}`);
      else announce = route.bodyLimit + int(rng, 1, 1 << 20);
    }
    if (chance(rng, 0.15)) {
      contentType = pick(rng, [...CONTENT_TYPES, undefined]);
      kind.push(`type:${contentType ?? 'none'}`);
    }
  }
  const { headers, replay } = await sign(rng, keys, route, method, path, body, kind);
  if ((route.url === '/v1/completions' || route.url === '/v1/chat/completions') && chance(rng, 0.8)) {
    const own = chance(rng, 0.9);
    headers.authorization = own ? `Bearer ${keys.apiKey}` : `Bearer nk-${hex(rng, 48)}`;
    kind.push(own ? 'api-key:valid' : 'api-key:unknown');
  }
  if (route.url.startsWith('/operator/') && chance(rng, 0.8)) {
    const own = chance(rng, 0.9);
    headers.cookie = own ? keys.operatorCookie : `nimble_operator=${hex(rng, 43)}`;
    if (chance(rng, 0.9)) headers['sec-fetch-site'] = 'same-origin';
    kind.push(own ? 'operator:valid' : 'operator:unknown');
  }
  if (contentType) headers['content-type'] = contentType;
  const req: FuzzRequest = { target, route: `${route.method} ${route.url}`, kind, method, path, headers, body, announce };
  return replay ? [req, { ...req, kind: [...kind, 'replayed'] }] : [req];
}

/**
 * Valid requests the fuzz itself may make are kept from disturbing the
 * honest run: a run it creates needs more miners than exist (so it only
 * waits), and a join keeps the attacker's session key and tiny hardware (so
 * it is never placed). Anything invalid stays as it is.
 */
function keepHarmless(route: RouteSummary, value: unknown, keys: FuzzKeys): unknown {
  if (route.url === '/runs' && route.method === 'POST' && Value.Check(CreateRunRequest, value)) return { ...value, minMiners: 100_000 };
  if (route.url === '/miners/join' && Value.Check(JoinRequest, value)) return { ...value, sessionKey: keys.sessionPublicKey, hardware: { gflops: 0.001, threads: 1, memoryBytes: 1 } };
  return value;
}

/** A request to no route at all. */
export function unknownRoute(rng: Rng, target: string): FuzzRequest {
  const path = pick(rng, ['/', '/nope', '/runs/x/y/z', '/miners', '/miners/', '//health', '/health/', '/HEALTH', '/%2e%2e/%2e%2e/etc/passwd', `/${'a'.repeat(5000)}`, '/runs/../health', '/.env', '/blobs', '/forward/x']);
  const method = pick(rng, METHODS);
  return { target, route: '(unknown)', kind: ['unknown'], method, path, headers: {} };
}

/** Bytes that are not quite HTTP: each should get a 4xx answer and a closed connection. */
export function rawRequest(rng: Rng, target: string): FuzzRequest {
  const enc = (s: string): Uint8Array => new TextEncoder().encode(s);
  const raws = [
    'GARBAGE\r\n\r\n',
    `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
    'POST /miners/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
    'POST /miners/heartbeat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n',
    'GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n',
    'GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n',
    'GET /health HTTP/9.9\r\nHost: x\r\n\r\n',
    'GET /health HTTP/1.1\r\nHost: x\r\nX-\u0001: y\r\n\r\n',
    'GET /he\u0000alth HTTP/1.1\r\nHost: x\r\n\r\n',
    `GET /${'a'.repeat(70_000)} HTTP/1.1\r\nHost: x\r\n\r\n`,
    'GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n',
    'GET /health HTTP/1.1\r\n Host: x\r\n\r\n',
    '\r\n\r\n\r\n',
    'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n',
  ];
  const raw = pick(rng, raws);
  return { target, route: '(raw)', kind: ['raw', raw.slice(0, 40)], method: 'RAW', path: '', headers: {}, raw: enc(raw) };
}
