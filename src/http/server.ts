// The HTTP plumbing the orchestrator and the miners' peer API share: a fastify
// instance whose routes declare their contract as TypeBox schemas (params,
// querystring, body, response), checked with TypeBox's compiled validators
// (no coercion of bodies), one body parser per kind of body, and the one error
// handler that turns every error into the error contract of
// src/protocol/errors.ts: HTTP status, `{ "error": message, "code": code }`.
// It also keeps callers within limits before it works for them: timeouts for
// slow clients, the rate of wallet signatures, the bytes of large bodies in
// flight, and connections closed (lingering) on bodies refused unread
// (docs/protocol.md, "HTTP limits").
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { TypeCompiler, type TypeCheck } from '@sinclair/typebox/compiler';
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyRequest, type RawServerDefault } from 'fastify';
import type { Address } from 'viem';
import { asNimbleError, AuthError, NimbleError } from '../protocol/errors.ts';
import { AUTH_HEADERS, type RequestVerifier, type SignatureScheme, type VerifiedRequest } from '../protocol/signing.ts';
import { BodyBudget, TokenBucket } from './limits.ts';
import { strictValidatorCompiler } from './validator.ts';

/** A fastify instance whose route schemas type the handlers. */
export type HttpServer = FastifyInstance<RawServerDefault, IncomingMessage, ServerResponse, FastifyBaseLogger, TypeBoxTypeProvider>;

declare module 'fastify' {
  interface FastifyRequest {
    /** the body as received, for signature checks */
    rawBody?: Uint8Array;
    /** the verified signer of a signed route's request */
    signer?: Address;
    /** what its verified headers say (the body must hash to their sha256) */
    verified?: VerifiedRequest;
  }
  interface FastifyContextConfig {
    /**
     * Requests must be signed (src/protocol/signing.ts): `'session'` by the
     * signer's session key, `'wallet'` by its wallet key (joining). The handler
     * finds the signer with `signerOf`.
     */
    signed?: SignatureScheme;
    /**
     * The request may be signed, with either key: one that carries a
     * signature is verified as a signed route's is (and refused when it does
     * not verify), one without is taken as anonymous. The handler reads the
     * signer, if any, from `req.signer` (a public view that shows more to
     * the party it belongs to).
     */
    mayBeSigned?: boolean;
  }
}

/** The body of a JSON request that did not parse (refused after the signature check). */
const NOT_JSON = Symbol('not JSON');

export interface HttpServerOptions {
  /** largest body a route accepts unless it sets its own `bodyLimit` */
  bodyLimit: number;
  /** a request refused with a 4xx, after the answer is chosen (count it against the signer, …) */
  onRefused?: (req: FastifyRequest, err: NimbleError) => void;
  /** a request that failed with a 5xx (log it) */
  onFailure?: (req: FastifyRequest, err: NimbleError) => void;
  /** how long a client may take to send a request (DEFAULT_HTTP_TIMEOUTS; tests use short ones) */
  timeouts?: Partial<HttpTimeouts>;
  /** checks the signature of routes declared with `config: { signed }` */
  verifier?: RequestVerifier;
  /** wallet-signed requests (costly to check) accepted per second at most, with this burst (default 20 and 100) */
  walletRate?: { perSecond: number; burst: number };
  /**
   * bodies over LARGE_BODY being received at once, in bytes as announced: for
   * one signer, and in all (default: the largest body a route takes, and four
   * times that); a body is held whole before it is checked, so this bounds the
   * memory that uploads can take
   */
  bodyBudget?: { perSigner: number; total: number };
}

/**
 * How long a client may take, so that slow or stalled clients (slowloris:
 * headers or a body trickled in a byte at a time) cannot hold connections
 * open. Every limit cuts the connection (a 408 answer when the request is
 * still being read). docs/protocol.md, "HTTP limits", says why each value.
 */
export interface HttpTimeouts {
  /** the whole request head (request line and headers) must arrive within this */
  headersMs: number;
  /** the whole request, body included, must arrive within this */
  requestMs: number;
  /** a connection on which nothing moves either way for this long is closed */
  idleMs: number;
  /** an idle keep-alive connection between two requests is closed after this */
  keepAliveMs: number;
  /** how often open connections are checked against headersMs and requestMs */
  checkEveryMs: number;
}

/**
 * The values a real deployment uses. Programs send a request head in one
 * packet, so 10 s for it is generous and stops header trickling quickly. The
 * largest body (a 256 MiB upload) arrives within 120 s at 18 Mbit/s and above;
 * the bodies actually sent today are a few MB. 30 s of silence is also what
 * our clients wait for an answer before giving up (src/http/client.ts).
 * Miners send a heartbeat every 250 ms, so 10 s of keep-alive keeps their
 * connections without holding idle ones long (fetch's client lets its own go
 * a second before the server's announced 10 s).
 */
export const DEFAULT_HTTP_TIMEOUTS: HttpTimeouts = { headersMs: 10_000, requestMs: 120_000, idleMs: 30_000, keepAliveMs: 10_000, checkEveryMs: 1_000 };

/** The JSON body of every error answer (part of every route's response schema). */
export const ErrorBody = Type.Object({ error: Type.String(), code: Type.String({ pattern: '^[a-z_0-9]{1,64}$' }) });
export type ErrorBody = Static<typeof ErrorBody>;

/** Media types of the binary routes (tensor frames, check bundles, stage states). */
export const BINARY = 'application/octet-stream';

export function createHttpServer(options: HttpServerOptions): HttpServer {
  const t = { ...DEFAULT_HTTP_TIMEOUTS, ...options.timeouts };
  const app = Fastify({
    logger: false,
    bodyLimit: options.bodyLimit,
    requestTimeout: t.requestMs,
    connectionTimeout: t.idleMs,
    keepAliveTimeout: t.keepAliveMs,
    http: { headersTimeout: Math.min(t.headersMs, t.requestMs), requestTimeout: t.requestMs, connectionsCheckingInterval: t.checkEveryMs },
    clientErrorHandler: answerClientError,
    // path params are limited by their schemas (which say why), not cut at the router's default of 100 characters
    routerOptions: { maxParamLength: 1024 },
    // a URL the router cannot decode, or a param past maxParamLength: answered in the error contract too
    frameworkErrors: (err, req, reply) => {
      const e = err.code === 'FST_ERR_MAX_PARAM_LENGTH' ? new NimbleError('too_large', 'a path segment is too long', 414) : new NimbleError('invalid', 'the URL is not valid (bad percent-encoding?)');
      const json = JSON.stringify({ error: e.message, code: e.code } satisfies ErrorBody);
      reply.raw.writeHead(e.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
      reply.raw.end(req.method === 'HEAD' ? undefined : json);
    },
  }).withTypeProvider<TypeBoxTypeProvider>();
  app.setValidatorCompiler(strictValidatorCompiler);
  // every route's contract includes its error answers
  const routes: RouteSummary[] = [];
  declared.set(app, routes);
  app.addHook('onRoute', (route) => {
    route.schema = { ...route.schema, response: { '4xx': ErrorBody, '5xx': ErrorBody, ...(route.schema?.response as Record<string, TSchema> | undefined) } };
    const schema = route.schema as { params?: TSchema; querystring?: TSchema; body?: TSchema };
    for (const method of [route.method].flat()) {
      routes.push({ method, url: route.url, signed: route.config?.signed, mayBeSigned: route.config?.mayBeSigned === true, bodyLimit: route.bodyLimit ?? options.bodyLimit, params: schema.params, querystring: schema.querystring, body: schema.body });
    }
  });
  app.setSerializerCompiler(({ schema }) => responseSerializer(schema as TSchema));
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (req, body: Buffer, done) => {
    req.rawBody = new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
    if (body.length === 0) return done(null, undefined);
    try {
      done(null, JSON.parse(body.toString('utf8')));
    } catch {
      done(null, NOT_JSON);
    }
  });
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (req, body: Buffer, done) => {
    req.rawBody = new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
    done(null, req.rawBody);
  });
  // before the body is read: the signature, from the headers (which carry the body's signed sha256)
  const walletBucket = new TokenBucket(options.walletRate?.perSecond ?? 20, options.walletRate?.burst ?? 100);
  let budget: BodyBudget | null = null;
  app.addHook('onRequest', async (req, reply) => {
    const scheme = req.routeOptions.config.signed;
    const optional = !scheme && req.routeOptions.config.mayBeSigned === true && req.headers[AUTH_HEADERS.signature] !== undefined;
    if (!scheme && !optional) return;
    if (!options.verifier) throw new NimbleError('internal', `${req.routeOptions.url} is signed but the server has no verifier`);
    const verified = await options.verifier.verifyHeaders({
      method: req.method,
      path: req.url,
      headers: req.headers,
      // the right key for the route, then (wallet signatures being costly to check) a few a second; a request whose headers
      // are missing, malformed, stale or of the wrong key costs nothing and takes no turn
      beforeSignatureCheck: (given) => {
        if (scheme && given !== scheme) throw new AuthError('bad_signature', `${req.routeOptions.url} must be signed with the ${scheme} key, not the ${given} key`);
        if (given === 'wallet' && !walletBucket.take()) throw new NimbleError('rate_limited', 'too many wallet-signed requests; retry in a moment');
      },
    });
    req.verified = verified;
    req.signer = verified.signer;
    // a large body is taken only within the signer's share of the bytes in flight
    const size = announcedBodyBytes(req);
    if (size > LARGE_BODY) {
      budget ??= bodyBudgetOf(app, options);
      reply.raw.once('close', budget.reserve(verified.signer, size));
    }
  });
  // before the body is validated or used: the body against its signed hash, then whether it parsed
  app.addHook('preValidation', async (req) => {
    if (req.verified) options.verifier!.checkBody(req.verified, req.rawBody ?? new Uint8Array(0));
    if (req.body === NOT_JSON) throw new NimbleError('invalid', 'the body is not JSON');
  });
  app.setNotFoundHandler((req, reply) => {
    const path = req.url.split('?')[0];
    void reply.status(404).send({ error: `no route ${req.method} ${path.length > 200 ? `${path.slice(0, 200)}…` : path}`, code: 'not_found' } satisfies ErrorBody);
  });
  app.setErrorHandler((raw: Error, req, reply) => {
    const err = toNimbleError(raw);
    // a body refused before it was read (a bad signature, too large) is not read: the connection closes after the answer
    if (req.rawBody === undefined && announcesBody(req)) {
      void reply.header('connection', 'close');
      lingerOnClose(req.raw.socket);
    }
    // 507 (a store full, a disk under its reserve) is said, not a failure: its message tells the caller what to do
    if (err.isClientError || err.status === 507) options.onRefused?.(req, err);
    else options.onFailure?.(req, err);
    void reply.status(err.status).send({ error: err.status >= 500 && err.status !== 507 ? 'internal error' : err.message, code: err.code } satisfies ErrorBody);
  });
  return app;
}

/** A route a server declares: what a caller must send it (the schemas as declared, before fastify's conversions). */
export interface RouteSummary {
  method: string;
  /** with its `:param` placeholders */
  url: string;
  signed: SignatureScheme | undefined;
  /** signed or not, as the caller chooses (`config.mayBeSigned`) */
  mayBeSigned: boolean;
  bodyLimit: number;
  params: TSchema | undefined;
  querystring: TSchema | undefined;
  body: TSchema | undefined;
}

const declared = new WeakMap<HttpServer, RouteSummary[]>();

/** Every route declared on a server made by createHttpServer (HEAD routes included), in the order declared. */
export function routesOf(app: HttpServer): readonly RouteSummary[] {
  return declared.get(app) ?? [];
}

/**
 * Errors found before a request reaches fastify (a request head too slow,
 * too large or malformed), answered in the error contract on the raw socket,
 * which then closes after what the client still sends is drained (LINGER_MS).
 */
function answerClientError(err: Error & { code?: string; rawPacket?: unknown }, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  // the answer to a HEAD request has no body (a client would read one as the start of another answer)
  const head = Buffer.isBuffer(err.rawPacket) && err.rawPacket.subarray(0, 5).toString('latin1') === 'HEAD ';
  const [status, body]: [number, ErrorBody] =
    err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? [408, { error: 'the request did not arrive in time', code: 'timeout' }]
      : err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, { error: 'the request head is larger than this server accepts', code: 'too_large' }]
        : [400, { error: 'malformed HTTP request', code: 'invalid' }];
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const json = JSON.stringify(body);
  socket.end(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Length: ${Buffer.byteLength(json)}\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n${head ? '' : json}`);
  // linger as lingerOnClose does: the rest of a head too large is still arriving; destroying now would reset the
  // connection with it unread, and a client slow to read could lose the answer to the reset
  socket.on('data', () => {});
  const timer = setTimeout(() => socket.destroy(), LINGER_MS);
  timer.unref();
  socket.once('close', () => clearTimeout(timer));
}

/** Bodies up to this size are not counted against the body budget (each route's limit bounds them). */
export const LARGE_BODY = 1 << 20;

/** The body budget of a server: as configured, or one largest body per signer and four in all. */
function bodyBudgetOf(app: HttpServer, options: HttpServerOptions): BodyBudget {
  const largest = Math.max(options.bodyLimit, ...routesOf(app).map((r) => r.bodyLimit));
  return new BodyBudget(options.bodyBudget?.perSigner ?? largest, options.bodyBudget?.total ?? 4 * largest);
}

/** The body size a request announces: its content-length, or its route's limit when it is sent in chunks; 0 without a body. */
function announcedBodyBytes(req: FastifyRequest): number {
  const length = req.headers['content-length'];
  if (length !== undefined) return Number(length) || 0;
  return req.headers['transfer-encoding'] !== undefined ? (req.routeOptions.bodyLimit ?? 0) : 0;
}

/** Whether a request comes with a body (announced by its headers). */
function announcesBody(req: FastifyRequest): boolean {
  const length = req.headers['content-length'];
  return (length !== undefined && length !== '0') || req.headers['transfer-encoding'] !== undefined;
}

/** How long a connection closed on a body refused unread goes on taking (and dropping) what the client still sends. */
export const LINGER_MS = 2_000;

/**
 * Closes the connection after an answer given before the request's body was
 * read, the way servers "linger": the answer and a FIN go out, whatever the
 * client goes on sending is read and dropped (never kept) for LINGER_MS, then
 * the connection is dropped. Closing at once would reset a connection with
 * unread bytes in flight, and the client, still sending, could lose the
 * answer to the reset. Node closes a `connection: close` answer's socket
 * with destroySoon(); this socket's does the above instead.
 */
function lingerOnClose(socket: Socket): void {
  socket.destroySoon = function (this: Socket): void {
    this.end();
    const timer = setTimeout(() => this.destroy(), LINGER_MS);
    timer.unref();
    this.once('close', () => clearTimeout(timer));
  };
}

/** Any error a route can throw, as the error contract. */
export function toNimbleError(err: Error): NimbleError {
  if (err instanceof NimbleError) return err;
  const f = err as FastifyError;
  if (f.validation) {
    const first = f.validation[0];
    const at = first?.instancePath || '/';
    return new NimbleError('invalid', `invalid ${f.validationContext ?? 'request'}: ${at} ${first?.message ?? 'does not match the schema'}`);
  }
  if (f.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return new NimbleError('too_large', 'the body is larger than this route accepts', 413);
  if (f.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') return new NimbleError('unsupported_media_type', err.message, 415);
  if (typeof f.statusCode === 'number' && f.statusCode >= 400 && f.statusCode < 500) return new NimbleError('invalid', err.message, f.statusCode);
  return asNimbleError(err);
}

const checks = new WeakMap<TSchema, TypeCheck<TSchema>>();

/**
 * Responses are checked against their schema before they leave: a server
 * never answers outside its contract (a mismatch is a 500, logged).
 */
function responseSerializer(schema: TSchema): (data: unknown) => string {
  let check = checks.get(schema);
  if (!check) checks.set(schema, (check = TypeCompiler.Compile(schema)));
  const compiled = check;
  return (data) => {
    if (!compiled.Check(data)) {
      const first = compiled.Errors(data).First();
      throw new NimbleError('internal', `response does not match its schema: ${first?.path || '/'} ${first?.message ?? ''}`, 500);
    }
    return JSON.stringify(data);
  };
}
