// A server made by createHttpServer in a process of its own, for tests whose
// client must not share the server's event loop (connections closed under a
// client still sending). Prints {"port": N} once listening; stops with its parent.
import { Type } from '@sinclair/typebox';
import { createHttpServer } from '../../src/http/server.ts';
import { signerOf } from '../../src/http/signed.ts';
import { RequestVerifier } from '../../src/protocol/signing.ts';

const app = createHttpServer({ bodyLimit: 1 << 20, verifier: new RequestVerifier() });
app.post('/signed', { config: { signed: 'wallet' }, schema: { response: { 200: Type.Object({ signer: Type.String() }) } } }, async (req) => ({ signer: signerOf(req) }));
await app.listen({ host: '127.0.0.1', port: 0 });
process.stdout.write(`${JSON.stringify({ port: (app.server.address() as { port: number }).port })}\n`);
process.stdin.on('end', () => void app.close().then(() => process.exit(0)));
process.stdin.resume();
