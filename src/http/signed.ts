// The signer of a signed route's request (routes declared with
// `config: { signed: true }`; src/http/server.ts verifies the signature over
// the body as received before anything else looks at the request).
import type { FastifyRequest } from 'fastify';

/** The verified signer of a request to a signed route. */
export function signerOf(req: FastifyRequest): `0x${string}` {
  if (!req.signer) throw new Error(`${req.method} ${req.url} is not a signed route`);
  return req.signer;
}
