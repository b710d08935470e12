// Signed routes: a hook that verifies a request's signature (src/protocol/
// signing.ts) over the body exactly as received, before the body is validated
// or used, and records the signer on the request.
import type { FastifyRequest } from 'fastify';
import type { RequestVerifier } from '../protocol/signing.ts';

/** A `preValidation` hook for signed routes: sets `req.signer` or throws AuthError (401/503). */
export function verifySignature(verifier: RequestVerifier): (req: FastifyRequest) => Promise<void> {
  return async (req) => {
    req.signer = await verifier.verify({ method: req.method, path: req.url, headers: req.headers, body: req.rawBody ?? new Uint8Array(0) });
  };
}

/** The verified signer of a request that passed `verifySignature`. */
export function signerOf(req: FastifyRequest): `0x${string}` {
  if (!req.signer) throw new Error(`${req.method} ${req.url} is not a signed route`);
  return req.signer;
}
