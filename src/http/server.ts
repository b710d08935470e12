// The HTTP plumbing the orchestrator and the miners' peer API share: a fastify
// instance whose routes declare their contract as TypeBox schemas (params,
// querystring, body, response), checked with TypeBox's compiled validators
// (no coercion of bodies), one body parser per kind of body, and the one error
// handler that turns every error into the error contract of
// src/protocol/errors.ts: HTTP status, `{ "error": message, "code": code }`.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { TypeCompiler, type TypeCheck } from '@sinclair/typebox/compiler';
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyRequest, type RawServerDefault } from 'fastify';
import type { Address } from 'viem';
import { asNimbleError, AuthError, NimbleError } from '../protocol/errors.ts';
import type { RequestVerifier, SignatureScheme, VerifiedRequest } from '../protocol/signing.ts';
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
  /** a client that sends nothing for this long is cut off (default 60 s) */
  requestTimeoutMs?: number;
  /** checks the signature of routes declared with `config: { signed }` */
  verifier?: RequestVerifier;
  /** wallet-signed requests (costly to check) accepted per second at most, with this burst (default 20 and 100) */
  walletRate?: { perSecond: number; burst: number };
}

/** The JSON body of every error answer (part of every route's response schema). */
export const ErrorBody = Type.Object({ error: Type.String(), code: Type.String({ pattern: '^[a-z_0-9]{1,64}$' }) });
export type ErrorBody = Static<typeof ErrorBody>;

/** Media types of the binary routes (tensor frames, check bundles, stage states). */
export const BINARY = 'application/octet-stream';

export function createHttpServer(options: HttpServerOptions): HttpServer {
  const app = Fastify({
    logger: false,
    bodyLimit: options.bodyLimit,
    requestTimeout: options.requestTimeoutMs ?? 60_000,
    connectionTimeout: options.requestTimeoutMs ?? 60_000,
  }).withTypeProvider<TypeBoxTypeProvider>();
  app.setValidatorCompiler(strictValidatorCompiler);
  // every route's contract includes its error answers
  app.addHook('onRoute', (route) => {
    route.schema = { ...route.schema, response: { '4xx': ErrorBody, '5xx': ErrorBody, ...(route.schema?.response as Record<string, TSchema> | undefined) } };
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
  app.addHook('onRequest', async (req, reply) => {
    const scheme = req.routeOptions.config.signed;
    if (!scheme) return;
    if (!options.verifier) throw new NimbleError('internal', `${req.routeOptions.url} is signed but the server has no verifier`);
    // a refused request's body is not read: the connection closes after the answer
    if (req.headers['content-length'] !== '0' && (req.headers['content-length'] || req.headers['transfer-encoding'])) void reply.header('connection', 'close');
    if (scheme === 'wallet' && !walletBucket.take()) throw new NimbleError('overloaded', 'too many wallet-signed requests; retry in a moment');
    const verified = await options.verifier.verifyHeaders({ method: req.method, path: req.url, headers: req.headers });
    if (verified.scheme !== scheme) throw new AuthError('bad_signature', `${req.routeOptions.url} must be signed with the ${scheme} key, not the ${verified.scheme} key`);
    req.verified = verified;
    req.signer = verified.signer;
    void reply.removeHeader('connection');
  });
  // before the body is validated or used: the body against its signed hash, then whether it parsed
  app.addHook('preValidation', async (req) => {
    if (req.verified) options.verifier!.checkBody(req.verified, req.rawBody ?? new Uint8Array(0));
    if (req.body === NOT_JSON) throw new NimbleError('invalid', 'the body is not JSON');
  });
  app.setNotFoundHandler((req, reply) => {
    void reply.status(404).send({ error: `no route ${req.method} ${req.url.split('?')[0]}`, code: 'not_found' } satisfies ErrorBody);
  });
  app.setErrorHandler((raw: Error, req, reply) => {
    const err = toNimbleError(raw);
    if (err.isClientError) options.onRefused?.(req, err);
    else options.onFailure?.(req, err);
    void reply.status(err.status).send({ error: err.status >= 500 ? 'internal error' : err.message, code: err.code } satisfies ErrorBody);
  });
  return app;
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

/** A token bucket: `perSecond` tokens a second, at most `burst` saved. */
class TokenBucket {
  private tokens: number;
  private at = Date.now();

  constructor(
    private readonly perSecond: number,
    private readonly burst: number,
  ) {
    this.tokens = burst;
  }

  take(): boolean {
    const now = Date.now();
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.at) / 1000) * this.perSecond);
    this.at = now;
    if (this.tokens < 1) return false;
    this.tokens--;
    return true;
  }
}
