// The routes the fuzz test (test/network/fuzz.test.ts) throws requests at,
// and a check that they are all of them.
//
// `declaredRoutes` reads the routes from servers built in this process (never
// started) the way the real processes build theirs: the orchestrator's API
// with the job and dataset services src/orchestrator/server.ts gives it (the
// job routes are registered only with a JobService), a miner's peer API with
// its serving routes (src/miner/serve-api.ts, as src/miner/miner.ts adds
// them). `sourceRoutes` reads every literal route registration of src/
// (`app.post('/jobs', …)`), so a route whose registration the servers built
// here skip (a service not passed, a new file of routes) shows up as missing
// from the corpus instead of going unfuzzed.
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { routesOf, type RouteSummary } from '../../src/http/server.ts';
import { buildPeerApi } from '../../src/miner/peer-api.ts';
import { serveRoutes } from '../../src/miner/serve-api.ts';
import { FsBlobStore } from '../../src/orchestrator/blobs/blobs.ts';
import { buildApi } from '../../src/orchestrator/http.ts';
import { ModelUploads } from '../../src/orchestrator/models/model-uploads.ts';
import { DatasetService } from '../../src/orchestrator/jobs/datasets.ts';
import { DEFAULT_CHECKPOINT_RETENTION_MS, JobService } from '../../src/orchestrator/jobs/jobs.ts';
import { OrchestratorState } from '../../src/orchestrator/state/index.ts';
import { Coordinator } from '../../src/orchestrator/training/coordinator.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { RequestVerifier } from '../../src/protocol/signing.ts';
import { randomAddress } from './http-flood.ts';

export interface DeclaredRoutes {
  orchestrator: RouteSummary[];
  peer: RouteSummary[];
}

const SRC = fileURLToPath(new URL('../../src', import.meta.url));

/** The routes the orchestrator and a miner's peer API declare, read from servers built in process (never started). */
export async function declaredRoutes(): Promise<DeclaredRoutes> {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-fuzz-routes-'));
  const state = OrchestratorState.open(join(dir, 'o.sqlite'));
  try {
    const coordinator = new Coordinator(state, await FsBlobStore.open(join(dir, 'blobs')));
    const jobs = new JobService(coordinator, { checkpointRetentionMs: DEFAULT_CHECKPOINT_RETENTION_MS, slots: coordinator.slots });
    const datasets = new DatasetService(state, coordinator.blobs);
    const uploads = new ModelUploads(join(dir, 'uploads'));
    const api = buildApi(coordinator, null, jobs, datasets, undefined, null, null, { uploads });
    await api.ready();
    const stats = { forward: 0, backward: 0, merges: 0, bytesSent: 0, rejected: 0 };
    const verifier = new RequestVerifier();
    const peer = buildPeerApi({
      verifier,
      network: { domain: 'd', orchestratorKey: '', sessionKey: SessionKey.generate(), previousStage: () => [], nextStage: () => [] },
      work: { runner: null, queued: 0, expectsGradient: () => false, push: () => {} },
      stats,
      health: () => ({ ok: true, address: randomAddress(), stage: null, stats }),
      log: () => {},
    });
    const serving = serveRoutes(peer, { served: () => null, orchestrator: randomAddress(), verifier, log: () => {} });
    await peer.ready();
    const found = { orchestrator: [...routesOf(api)], peer: [...routesOf(peer)] };
    serving.closeChannels();
    await Promise.all([api.close(), peer.close(), coordinator.close()]);
    return found;
  } finally {
    state.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? sources(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** A literal route registration of src/: `app.get('/jobs/:id', …)` → GET /jobs/:id, with the file it is in. */
export interface SourceRoute {
  id: string;
  file: string;
}

/** Every route src/ registers with a literal path on an HTTP server (`app.<method>('/…'`). */
export function sourceRoutes(): SourceRoute[] {
  const out: SourceRoute[] = [];
  for (const file of sources(SRC)) {
    const text = readFileSync(file, 'utf8');
    for (const m of text.matchAll(/\bapp\.(get|post|put|delete|patch)\(\s*'(\/[^']*)'/g)) out.push({ id: `${m[1].toUpperCase()} ${m[2]}`, file: relative(SRC, file) });
  }
  return out;
}

/** The routes of src/ that no declared route matches: each is a route the fuzz would never send a request to. */
export function missingFromCorpus(declared: DeclaredRoutes): string[] {
  const ids = new Set([...declared.orchestrator, ...declared.peer].map((r) => `${r.method} ${r.url}`));
  return sourceRoutes().filter((r) => !ids.has(r.id)).map((r) => `${r.id} (src/${r.file})`);
}
