// Who may read which blob (src/orchestrator/blobs/access.ts), on a real state
// file filled through the stores: a miner reads what its current work names
// (its stage's state and initial checkpoint, its run's dataset when its stage
// reads data, the slices of the partitions it merges and the merged partitions
// of its round once they are applied, its deployment's file) and nothing of
// another stage, run or round; a developer reads its own datasets, checkpoints
// and models; anyone reads a published model's file, and nothing else; the
// refusal is the same whether the blob exists or not.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { gptConfig } from '../../../src/model/config.ts';
import { modelParts } from '../../../src/model/model-ref.ts';
import { wholeModelRef } from '../../../src/model/whole-model.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { BlobAccess, UNPUBLISHED_RECHECK_MS, type BlobReader } from '../../../src/orchestrator/blobs/access.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';

const id = (c: string): string => c.repeat(64);
const BLOB = {
  dataset: id('1'),
  otherDataset: id('2'),
  checkpoint: id('3'),
  state0: id('4'),
  state1: id('5'),
  sliceP0: id('6'),
  sliceP1: id('7'),
  merged0: id('8'),
  otherRunState: id('9'),
  model: id('a'),
  published: id('b'),
  served: id('c'),
  missing: id('d'),
};
const DEV = '0x00000000000000000000000000000000000000d1';
const EVE = '0x00000000000000000000000000000000000000e1';
const M0 = '0x0000000000000000000000000000000000000a00'; // stage 0, merges partition 0
const M0B = '0x0000000000000000000000000000000000000a01'; // stage 0, merges partition 1
const M1 = '0x0000000000000000000000000000000000000a10'; // stage 1 (the last: reads data too)
const SERVER = '0x0000000000000000000000000000000000000a20';
const IDLE = '0x0000000000000000000000000000000000000a30'; // joined, holds nothing
const RUN = 'run-access';
const MODEL = 'gpt-micro';

let dir: string;
let state: OrchestratorState;
let now = 1_000_000;
const published = new Set<string>([BLOB.published]);
let registryReads = 0;
let access: BlobAccess;

const miner = (address: string): BlobReader => ({ kind: 'signer', address, miner: true });
const developer = (address: string): BlobReader => ({ kind: 'signer', address, miner: false });
const anyone: BlobReader = { kind: 'anyone' };

async function refused(reader: BlobReader, blob: string): Promise<void> {
  await assert.rejects(access.authorize(reader, blob), (e: unknown) => e instanceof NimbleError && e.status === 403 && e.code === 'forbidden', `${JSON.stringify(reader)} reads ${blob.slice(0, 4)}`);
}

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-access-'));
  state = OrchestratorState.open(join(dir, 'o.sqlite'));
  access = new BlobAccess(state, { published: async (sha) => (registryReads++, published.has(sha)) }, () => now);
  const parts = modelParts(MODEL);
  const options = { lr: 1e-3, codec: 'f32' as const, aggregator: 'mean' as const, minMiners: 1, outerLr: 0.7, outerMomentum: 0.9, requestedStages: 2, init: BLOB.checkpoint };
  state.runs.insert({ id: RUN, owner: DEV, model: MODEL, data: `sha256:${BLOB.dataset}`, steps: 100, batchSize: 2, mergeEvery: 10, seed: 1, options }, now);
  state.runs.insertStages(RUN, [{ from: 0, to: 1 }, { from: 1, to: parts }]);
  for (const [m, s] of [[M0, 0], [M0B, 0], [M1, 1]] as const) state.runs.assign(RUN, s, m, now);
  state.runs.finishRound(RUN, 0, 1, BLOB.state0);
  state.runs.finishRound(RUN, 1, 1, BLOB.state1);
  // another run's stage state, which nobody of this run may read
  state.runs.insert({ id: 'run-other', owner: EVE, model: MODEL, data: 'moby-dick', steps: 10, batchSize: 2, mergeEvery: 10, seed: 1, options: { ...options, init: undefined } }, now);
  state.runs.insertStages('run-other', [{ from: 0, to: parts }]);
  state.runs.finishRound('run-other', 0, 1, BLOB.otherRunState);
  // stage 0's open round (round 2): M0 merges partition 0, M0B partition 1
  const key = { runId: RUN, stage: 0, round: 2 };
  state.mergeRounds.open(key, { status: 'uploading', partitions: 2, replicas: [M0, M0B], plan: { mergers: [[M0], [M0B]], chosen: null, phaseAt: now }, startedAt: now });
  for (const [m, p, blob] of [[M0, 0, BLOB.sliceP0], [M0, 1, BLOB.sliceP1]] as const) state.mergeRounds.putUpload(key, { minerId: m, partition: p, blob, samples: 10, norm: 1 });
  state.datasets.add({ sha256: BLOB.dataset, owner: DEV, bytes: 100, retentionMs: 1e9 }, now);
  state.datasets.add({ sha256: BLOB.otherDataset, owner: EVE, bytes: 100, retentionMs: 1e9 }, now);
  state.jobs.insert({ id: 'job-00000000000000d1', owner: DEV, spec: { name: 'mine', model: MODEL, data: `sha256:${BLOB.dataset}`, training: { steps: 100 } }, steps: 100, timeoutMs: 1e9, idleTimeoutMs: 1e9, checkpointEvery: 10, retentionMs: 1e9 }, now);
  state.jobs.addCheckpoint({ jobId: 'job-00000000000000d1', step: 10, tokens: 100, loss: 3, blob: BLOB.checkpoint, bytes: 1000 }, now);
  const config = gptConfig(MODEL);
  const ref = wholeModelRef({ kind: 'gpt', config });
  for (const [sha, owner] of [[BLOB.model, DEV], [BLOB.published, DEV], [BLOB.served, EVE]] as const) {
    state.models.claim({ sha256: sha, owner, name: owner === DEV ? 'm' : 'm-eve', bytes: 1000, kind: 'gpt', config, model: ref, jobId: null, step: 0 }, now);
  }
  state.deployments.insert({ id: 'dep-1', sha256: BLOB.served, name: 'm', owner: EVE, model: MODEL, replicas: 1, requestedStages: null, sessions: 1, registry: null, idleLimitMs: 1e9 }, now);
  state.deployments.assign('dep-1', 0, SERVER, now);
});

after(() => {
  state.close();
  rmSync(dir, { recursive: true, force: true });
});

test("a miner reads its stage's state, its initial checkpoint and (an edge stage) its run's dataset; nothing of another stage, run or developer", async () => {
  assert.equal(await access.authorize(miner(M0), BLOB.state0), 'stage_state');
  assert.equal(await access.authorize(miner(M1), BLOB.state1), 'stage_state');
  assert.equal(await access.authorize(miner(M0), BLOB.checkpoint), 'initial_state');
  assert.equal(await access.authorize(miner(M0), BLOB.dataset), 'training_data');
  assert.equal(await access.authorize(miner(M1), BLOB.dataset), 'training_data');
  await refused(miner(M0), BLOB.state1);
  await refused(miner(M1), BLOB.state0);
  await refused(miner(M0), BLOB.otherRunState);
  await refused(miner(M0), BLOB.otherDataset);
  await refused(miner(M0), BLOB.model);
  await refused(miner(M0), BLOB.served);
  // a joined miner holding nothing reads nothing, whatever kind the blob is, and whether it exists or not
  for (const blob of Object.values(BLOB)) if (blob !== BLOB.published) await refused(miner(IDLE), blob);
});

test('merge rounds: the slices of the partitions a replica merges while merging, the merged partitions once applying; never during uploads, never another partition or round', async () => {
  const key = { runId: RUN, stage: 0, round: 2 };
  // uploading: nobody downloads slices yet
  await refused(miner(M0), BLOB.sliceP0);
  state.mergeRounds.update(key, { status: 'merging' });
  assert.equal(await access.authorize(miner(M0), BLOB.sliceP0), 'merge_slice');
  await refused(miner(M0), BLOB.sliceP1); // partition 1 is M0B's to merge
  assert.equal(await access.authorize(miner(M0B), BLOB.sliceP1), 'merge_slice');
  await refused(miner(M0B), BLOB.sliceP0);
  await refused(miner(M1), BLOB.sliceP0); // another stage's round
  // a merger replaced takes its partition over
  state.mergeRounds.update(key, { plan: { mergers: [[M0, M0B], [M0B]], chosen: null, phaseAt: now } });
  assert.equal(await access.authorize(miner(M0B), BLOB.sliceP0), 'merge_slice');
  await refused(miner(M0), BLOB.merged0);
  state.mergeRounds.update(key, { status: 'applying', plan: { mergers: [[M0, M0B], [M0B]], chosen: [BLOB.merged0, BLOB.sliceP1], phaseAt: now } });
  assert.equal(await access.authorize(miner(M0), BLOB.merged0), 'merged_partition');
  assert.equal(await access.authorize(miner(M0B), BLOB.merged0), 'merged_partition');
  await refused(miner(M1), BLOB.merged0);
  // the round is done: what it named is nobody's to read any more
  state.mergeRounds.update(key, { status: 'done' });
  await refused(miner(M0), BLOB.merged0);
  await refused(miner(M0B), BLOB.sliceP0);
});

test("a serving miner reads its deployment's file (published or not), and no longer once it is undeployed", async () => {
  assert.equal(await access.authorize(miner(SERVER), BLOB.served), 'served_model');
  await refused(miner(SERVER), BLOB.model);
  await refused(miner(M0), BLOB.served);
  state.deployments.undeploy('dep-1', 'test', now);
  await refused(miner(SERVER), BLOB.served);
});

test("a developer reads its own datasets, checkpoints and models; another's, and a miner's work, are refused", async () => {
  assert.equal(await access.authorize(developer(DEV), BLOB.dataset), 'own_dataset');
  assert.equal(await access.authorize(developer(DEV), BLOB.checkpoint), 'own_checkpoint');
  assert.equal(await access.authorize(developer(DEV), BLOB.model), 'own_model');
  assert.equal(await access.authorize(developer(DEV.toUpperCase().replace('0X', '0x')), BLOB.model), 'own_model', 'addresses compare without case');
  for (const blob of [BLOB.dataset, BLOB.checkpoint, BLOB.model, BLOB.state0, BLOB.sliceP0]) await refused(developer(EVE), blob);
  assert.equal(await access.authorize(developer(EVE), BLOB.served), 'own_model');
  assert.equal(await access.authorize(developer(EVE), BLOB.otherDataset), 'own_dataset');
  // a wallet-signed request is no miner's, even from a miner's address
  await refused(developer(M0), BLOB.state0);
  // the run's checkpoint: its owner's
  access.authorizeRun(developer(DEV), RUN);
  assert.throws(() => access.authorizeRun(developer(EVE), RUN), (e: unknown) => e instanceof NimbleError && e.status === 403);
  assert.throws(() => access.authorizeRun(anyone, RUN), (e: unknown) => e instanceof NimbleError && e.status === 403);
  access.authorizeRun({ kind: 'operator' }, RUN);
  assert.equal(await access.authorize({ kind: 'operator' }, BLOB.otherDataset), 'operator');
});

test('anyone reads a published model and nothing else; a "not published" is asked again after a while, a "published" kept', async () => {
  assert.equal(await access.authorize(anyone, BLOB.published), 'published_model');
  assert.equal(await access.authorize(developer(EVE), BLOB.published), 'published_model');
  assert.equal(await access.authorize(miner(IDLE), BLOB.published), 'published_model');
  for (const blob of Object.values(BLOB)) if (blob !== BLOB.published) await refused(anyone, blob);
  // the unpublished model becomes public once published (within UNPUBLISHED_RECHECK_MS); the registry is read once a while
  const reads = registryReads;
  await refused(anyone, BLOB.model);
  await refused(anyone, BLOB.model);
  assert.equal(registryReads, reads, 'a recent "not published" is not asked again');
  published.add(BLOB.model);
  await refused(anyone, BLOB.model);
  now += UNPUBLISHED_RECHECK_MS;
  assert.equal(await access.authorize(anyone, BLOB.model), 'published_model');
  const after = registryReads;
  assert.equal(await access.authorize(anyone, BLOB.model), 'published_model');
  assert.equal(registryReads, after, 'a "published" is kept');
  // a blob that is no stored model is never asked of the registry
  await refused(anyone, BLOB.missing);
  assert.equal(registryReads, after);
  // without a registry (no chain) nothing is published
  await assert.rejects(new BlobAccess(state, null).authorize(anyone, BLOB.published), (e: unknown) => e instanceof NimbleError && e.status === 403);
});
