// The public routes: what developers, the CLI and dashboards read, and what
// developers do with their runs (create, cancel, download the checkpoint),
// signed with their wallet key; the chain the network pays on (GET /chain).
// Contracts in src/api/schemas.ts.
import { Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { RunMerges } from '../../api/merges.ts';
import { chainMessage } from '../../api/network.ts';
import { ChainAnswer, ChainView, CreateRunRequest, EpochList, EpochView, Health, MinerView, RunView, WorkTotal } from '../../api/schemas.ts';
import { chainIdentityOf } from '../../chain/identity.ts';
import type { HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { NetworkInfo } from '../../protocol/messages.ts';
import { challengeMessage } from '../../protocol/network.ts';
import type { ChainOptions } from '../rewards/epochs.ts';
import { blobReaderOf, type BlobAccess } from '../blobs/access.ts';
import { assembleCheckpoint } from '../training/checkpoint.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { mergeRoundsView } from '../training/merge-rounds-view.ts';
import { epochView, minerView, runView, workView } from '../views.ts';

const RunParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9_.:-]+$' }) });
/** A developer's action: signed with the developer's wallet key. */
const developer = { signed: 'wallet' } as const;
const EpochParams = Type.Object({ id: Type.Integer({ minimum: 1, maximum: 2 ** 31 - 1 }) });

const Challenge = Type.String({ pattern: '^[0-9a-f]{32,128}$' });

/** The chain's view, its identity read once (again after a failed read). */
function chainViewOf(chain: ChainOptions): () => Promise<ChainView> {
  let read: Promise<ChainView> | null = null;
  const { client } = chain;
  return () =>
    (read ??= chainIdentityOf(client).then(
      // exactly what the schema sends, so the signature is over what the caller reads
      (id) => Value.Clean(ChainView, Value.Clone({ ...id, rpcUrl: chain.publicRpcUrl ?? (chain.local ? client.rpcUrl : null), local: Boolean(chain.local), contracts: client.deployment })) as ChainView,
      (err: unknown) => {
        read = null;
        throw new NimbleError('unreachable', `the orchestrator cannot read its chain (${client.rpcUrl}) now: ${(err as Error).message.split('\n')[0]}`, 503);
      },
    ));
}

export function publicRoutes(app: HttpServer, c: Coordinator, chain: ChainOptions | null, access: BlobAccess): void {
  const { state } = c;
  const paid = chain !== null;
  const chainView = chain ? chainViewOf(chain) : async () => null;
  const view = (id: string): RunView => {
    const run = state.runs.get(id);
    if (!run) throw new NimbleError('not_found', `unknown run ${id}`);
    return runView(state, c.microbatches, run);
  };

  app.get('/health', { schema: { response: { 200: Health } } }, async () => ({ ok: true as const }));
  // the network's key, and its signature of the caller's fresh challenge (src/protocol/network.ts)
  app.get('/network', { schema: { querystring: Type.Object({ challenge: Challenge }), response: { 200: NetworkInfo } } }, async (req) => {
    const { key } = c.identity;
    return { publicKey: key.publicKey, signature: key.sign(challengeMessage(req.query.challenge)) };
  });
  // the chain this network pays on, signed for the caller's challenge: commands and miners acting for it use that chain (src/chain/identity.ts)
  app.get('/chain', { schema: { querystring: Type.Object({ challenge: Type.Optional(Challenge) }), response: { 200: ChainAnswer } } }, async (req) => {
    const view = await chainView();
    const { challenge } = req.query;
    return { chain: view, signature: challenge ? c.identity.key.sign(chainMessage(challenge, view)) : null };
  });
  app.get('/miners', { schema: { response: { 200: Type.Array(MinerView) } } }, async () => state.miners.list().map(minerView));
  app.get('/runs', { schema: { response: { 200: Type.Array(RunView) } } }, async () => state.runs.list().map((r) => runView(state, c.microbatches, r)));
  app.get('/runs/:id', { schema: { params: RunParams, response: { 200: RunView } } }, async (req) => view(req.params.id));
  // who did a run's work: its work log summed per miner and kind
  app.get('/runs/:id/work', { schema: { params: RunParams, response: { 200: Type.Array(WorkTotal) } } }, async (req) => {
    if (!state.runs.get(req.params.id)) throw new NimbleError('not_found', `unknown run ${req.params.id}`);
    return workView(state, req.params.id);
  });
  // a run's merge rounds the orchestrator keeps, newest first, the 200 newest at most (src/api/merges.ts)
  app.get('/runs/:id/merges', { schema: { params: RunParams, response: { 200: RunMerges } } }, async (req) => {
    if (!state.runs.get(req.params.id)) throw new NimbleError('not_found', `unknown run ${req.params.id}`);
    return mergeRoundsView(state, req.params.id);
  });
  app.post('/runs', { config: developer, schema: { body: CreateRunRequest, response: { 201: RunView } } }, async (req, reply) => {
    const run = c.createRun(req.body, signerOf(req));
    void reply.status(201);
    return view(run.id);
  });
  app.post('/runs/:id/cancel', { config: developer, schema: { params: RunParams, response: { 200: RunView } } }, async (req) => view(c.cancelRun(req.params.id, signerOf(req)).id));
  // the trained model is its owner's
  app.get('/runs/:id/checkpoint', { config: developer, schema: { params: RunParams } }, async (req, reply) => {
    if (state.runs.get(req.params.id)) access.authorizeRun(blobReaderOf(req.verified), req.params.id);
    const bytes = await assembleCheckpoint(state, c.blobs, req.params.id);
    void reply.header('content-type', 'application/octet-stream');
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  });
  app.get('/work', { schema: { response: { 200: Type.Array(WorkTotal) } } }, async () => workView(state));
  app.get('/epochs', { schema: { response: { 200: EpochList } } }, async () => ({ paid, epochs: state.ledger.epochs().map((e) => epochView(state, e)) }));
  app.get('/epochs/:id', { schema: { params: EpochParams, response: { 200: EpochView } } }, async (req) => {
    const e = state.ledger.epoch(req.params.id);
    if (!e) throw new NimbleError('not_found', `unknown epoch ${req.params.id}`);
    return epochView(state, e);
  });
}
