// A miner's deployment stage (src/miner/deployment.ts) on a real engine, its
// model file served from memory in place of the orchestrator's store and the
// registry read through a lookup: the weights are served only once the file's
// sha256 is the deployment's and (paid network) the ModelRegistry's on the
// miner's chain; a tampered file, a model the registry does not hold, another
// chain, or a miner without a chain on a paid network are refused and
// reported; a download cut short resumes; the loaded StageInference
// computes what the same stage from the checkpoint computes.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import { checkModelFile, type RegistryLookup } from '../../src/inference/verify.ts';
import { DeploymentServing } from '../../src/miner/deployment.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import type { DeploymentAssignment, DeploymentReport } from '../../src/protocol/messages.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';

const bytes = wholeModelBytes(31, 9);
const SHA = createHash('sha256').update(bytes).digest('hex');
const REGISTRY = '0x' + 'ab'.repeat(20);
let engine: Engine;
let dir: string;

before(async () => {
  engine = await Engine.create({ threads: 1 });
  dir = mkdtempSync(join(tmpdir(), 'nimble-serving-'));
});
after(async () => {
  await engine.close();
  rmSync(dir, { recursive: true, force: true });
});

const assignment = (over: Partial<DeploymentAssignment> = {}): DeploymentAssignment => ({
  deploymentId: 'dep-1',
  sha256: SHA,
  bytes: bytes.length,
  model: 'gpt-micro',
  stage: 1,
  stageCount: 2,
  from: 3,
  to: 4,
  maxSessions: 4,
  registry: null,
  ...over,
});

/** The store's file endpoint from memory: `body` from the offset asked, optionally cut after `cut` bytes; records the offsets asked. */
function store(body: Uint8Array, cut?: number): { open: (sha: string, offset: number) => Promise<Response>; offsets: number[] } {
  const offsets: number[] = [];
  return {
    offsets,
    open: async (_sha, offset) => {
      offsets.push(offset);
      const end = cut !== undefined && offsets.length === 1 ? cut : body.length;
      return new Response(body.slice(offset, end), { status: offset > 0 ? 206 : 200 });
    },
  };
}

const onChain = (over: Partial<Awaited<ReturnType<RegistryLookup>>> = {}): RegistryLookup => async () => ({ chainId: 31337, registry: REGISTRY, model: { id: 5n, name: 'micro', owner: '0x' + '1'.repeat(40) }, ...over });

/** A fresh miner's serving, in its own folder. */
function serving(open: (sha: string, offset: number) => Promise<Response>, lookup: RegistryLookup | null, sub: string): DeploymentServing {
  return new DeploymentServing({ engine, dir: join(dir, sub), address: '0x' + '12'.repeat(20), open, lookup, log: () => {}, downloadTries: 3 });
}

async function settle(s: DeploymentServing): Promise<DeploymentReport> {
  for (let i = 0; i < 400; i++) {
    const r = s.report()!;
    if (r.state !== 'loading') return r;
    await new Promise((res) => setTimeout(res, 5));
  }
  throw new Error('still loading');
}

test('an unpaid network: the file is checked against the deployment’s sha256, said so, and the stage computes what the checkpoint’s does', async () => {
  const s = serving(store(bytes).open, null, 'unpaid');
  assert.equal(s.report(), undefined);
  s.follow(assignment());
  assert.deepEqual(s.report(), { deploymentId: 'dep-1', stage: 1, state: 'loading' });
  assert.equal(s.served(), null, 'nothing is served while loading');
  assert.deepEqual(await settle(s), { deploymentId: 'dep-1', stage: 1, state: 'serving', sha256: SHA, verifiedBy: 'sha256' });
  const served = s.served()!;
  assert.deepEqual([served.inference.range, served.inference.maxSessions, served.inference.isLast], [{ from: 3, to: 4 }, 4, true]);
  const ref = inferenceFromCheckpoint(engine, bytes, { from: 3, to: 4 });
  const rows = new Float32Array(3 * 16).map((_, i) => Math.sin(i));
  served.inference.join('x');
  ref.join('x');
  assert.deepEqual(served.inference.prefill('x', rows), ref.prefill('x', rows));
  ref.release();
  assert.ok(existsSync(join(dir, 'unpaid', `${SHA}.safetensors`)));
  s.follow(null);
  assert.equal(s.report(), undefined);
  assert.equal(s.served(), null);
  await s.stop();
});

test('a paid network: the sha256 must be the ModelRegistry’s entry on the miner’s own chain', async () => {
  const paid = assignment({ registry: { chainId: 31337, address: REGISTRY, modelId: 5 } });
  const ok = serving(store(bytes).open, onChain(), 'paid');
  ok.follow(paid);
  assert.deepEqual(await settle(ok), { deploymentId: 'dep-1', stage: 1, state: 'serving', sha256: SHA, verifiedBy: 'chain' });
  await ok.stop();

  const cases: [RegistryLookup | null, RegExp][] = [
    [null, /registered on chain 31337 .* this miner has no chain to check them on: start it with --chain-rpc/],
    [onChain({ model: null }), /no model with sha256 [0-9a-f]{64} is published on chain 31337/],
    [onChain({ chainId: 1 }), /names ModelRegistry 0xabab.* on chain 31337; this miner's chain is 1/],
    [onChain({ model: { id: 6n, name: 'x', owner: '0x' + '1'.repeat(40) } }), /is model #6 on chain 31337, not #5/],
  ];
  for (const [i, [lookup, why]] of cases.entries()) {
    const s = serving(store(bytes).open, lookup, `paid-${i}`);
    s.follow(paid);
    const r = await settle(s);
    assert.equal(r.state, 'failed');
    assert.match(r.detail!, why);
    assert.equal(s.served(), null, 'nothing is served from weights that were not checked');
    await s.stop();
  }
});

test('a tampered file is refused and deleted; a download cut short resumes; a file already there is checked and reused', async () => {
  const tampered = new Uint8Array(bytes);
  tampered[tampered.length - 5] ^= 0xff;
  const bad = serving(store(tampered).open, null, 'tampered');
  bad.follow(assignment());
  const r = await settle(bad);
  assert.equal(r.state, 'failed');
  assert.match(r.detail!, new RegExp(`has sha256 [0-9a-f]{64}, not ${SHA} \\(the sha256 of the deployment\\)`));
  assert.deepEqual(readdirSync(join(dir, 'tampered')), [], 'nothing of it is left');
  await bad.stop();

  const cut = store(bytes, 1000);
  const resumed = serving(cut.open, null, 'resumed');
  resumed.follow(assignment());
  assert.equal((await settle(resumed)).state, 'serving');
  assert.deepEqual(cut.offsets, [0, 1000]);
  await resumed.stop();

  const again = store(bytes);
  const reuse = serving(again.open, null, 'resumed');
  reuse.follow(assignment({ stage: 0, from: 0, to: 3 }));
  assert.equal((await settle(reuse)).state, 'serving');
  assert.deepEqual(again.offsets, [], 'the file on disk was reused');
  // another stage replaces the one held
  reuse.follow(assignment({ deploymentId: 'dep-2' }));
  assert.equal(reuse.report()!.deploymentId, 'dep-2');
  assert.equal((await settle(reuse)).state, 'serving');
  await reuse.stop();
});

test('checkModelFile: the file must be the deployment’s before anything else', async () => {
  await assert.rejects(checkModelFile('0'.repeat(64), { sha256: SHA, registry: null }, null), (e: unknown) => e instanceof NimbleError && /not [0-9a-f]{64}/.test(e.message));
  assert.equal(await checkModelFile(SHA, { sha256: SHA, registry: null }, onChain()), 'sha256');
});
