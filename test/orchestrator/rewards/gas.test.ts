// The gas the orchestrator pays on others' behalf, bounded
// (src/orchestrator/rewards/gas.ts), with an injected clock: the sliding
// window per key; an owner's deploys counted from the deployments table (a
// 429 saying when the next is allowed, restarts included); the ModelRegistry
// flag transactions of RegistrySync within their budgets per owner and in
// all, a change past them waiting for a later pass, and one undone meanwhile
// costing nothing. The registry here is a counting stand-in: the real one is
// exercised by test/orchestrator/models/deployment-routes.test.ts and
// test/network/gas-limits.test.ts.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { checkDeployRate, RegistrySync, type ModelRegistryAccess } from '../../../src/orchestrator/models/deployment-registry.ts';
import { GAS_LIMITS, HOUR_MS, SlidingWindow } from '../../../src/orchestrator/rewards/gas.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';

const owner = (i: number): string => `0x${i.toString(16).padStart(40, '0')}`;

test('a sliding window allows `limit` per hour per key, says when the next is allowed, and gives back what sent nothing', async () => {
  const clock = { t: 1_000_000 };
  const w = new SlidingWindow(3, HOUR_MS, () => clock.t, 2);
  for (let i = 0; i < 3; i++) w.takeOrRefuse('a', 'releases of a');
  assert.throws(() => w.takeOrRefuse('a', 'releases of a'), (e: unknown) => e instanceof NimbleError && e.status === 429 && e.code === 'rate_limited' && /releases of a: 3 an hour at most; the next in 60 minutes/.test(e.message));
  assert.equal(w.count('b'), 0, 'another key has its own');
  clock.t += HOUR_MS - 60_000;
  assert.equal(w.waitMs('a'), 60_000);
  clock.t += 60_000;
  assert.equal(w.waitMs('a'), 0, 'an hour after the first, one more');
  // spend: given back when the action fails or sent nothing
  await assert.rejects(w.spend('a', 'x', async () => Promise.reject(new Error('refused'))), /refused/);
  assert.equal(await w.spend('a', 'x', async () => 'already closed', () => false), 'already closed');
  assert.equal(w.count('a'), 0);
  await w.spend('a', 'x', async () => 'sent');
  assert.equal(w.count('a'), 1);
  // at most maxKeys keys: the oldest is forgotten
  w.take('b');
  w.take('c');
  assert.equal(w.count('a'), 0);
});

test("an owner's deploys are counted from the deployments table: the seventh within an hour is a 429 naming when the next is allowed", () => {
  const state = OrchestratorState.open(':memory:');
  const t0 = 10 * HOUR_MS;
  const insert = (i: number, at: number, who = owner(1)): void => {
    state.deployments.insert({ id: `dep-${i}`, sha256: i.toString(16).padStart(64, '0'), name: 'm', owner: who, model: 'gpt-micro', replicas: 1, requestedStages: null, sessions: 4, registry: null, idleLimitMs: HOUR_MS }, at);
  };
  insert(0, t0 - HOUR_MS - 1); // more than an hour ago: not counted
  for (let i = 1; i <= GAS_LIMITS.deploysPerOwner; i++) {
    checkDeployRate(state, owner(1), t0 + i);
    insert(i, t0 + i);
  }
  assert.throws(
    () => checkDeployRate(state, owner(1).toUpperCase().replace('0X', '0x'), t0 + 100),
    (e: unknown) => e instanceof NimbleError && e.status === 429 && e.code === 'rate_limited' && /deployed 6 times in the last hour; .* at most 6 times an hour: the next in 60 minutes/.test(e.message),
  );
  checkDeployRate(state, owner(2), t0 + 100); // another owner is not held back
  checkDeployRate(state, owner(1), t0 + 1 + HOUR_MS); // an hour after the first of the six
  state.close();
});

/** A registry that counts the flag transactions it is asked for. */
function countingRegistry(): ModelRegistryAccess & { sent: { id: bigint; deployed: boolean }[]; flags: Map<string, boolean> } {
  const flags = new Map<string, boolean>();
  const ids = new Map<string, bigint>();
  const sent: { id: bigint; deployed: boolean }[] = [];
  return {
    chainId: 31337,
    address: '0x0000000000000000000000000000000000000001',
    sent,
    flags,
    async lookup(sha256) {
      if (!ids.has(sha256)) ids.set(sha256, BigInt(ids.size + 1));
      return { id: ids.get(sha256)!, name: sha256.slice(0, 6), owner: '', deployed: flags.get(sha256) ?? false };
    },
    async setDeployed(modelId, deployed) {
      sent.push({ id: modelId, deployed });
      for (const [sha, id] of ids) if (id === modelId) flags.set(sha, deployed);
      return `0x${sent.length.toString(16).padStart(64, '0')}`;
    },
  };
}

test('the registry flag transactions stay within their budgets per owner and in all; a change past them waits, one undone meanwhile costs nothing', async () => {
  const state = OrchestratorState.open(':memory:');
  const clock = { t: 5 * HOUR_MS };
  const registry = countingRegistry();
  const logs: string[] = [];
  const sync = new RegistrySync(state, registry, (l) => logs.push(l), () => clock.t);
  let n = 0;
  const serving = (who: string): string => {
    const id = `dep-${n}`;
    const sha256 = n.toString(16).padStart(64, '0');
    n++;
    state.deployments.insert({ id, sha256, name: id, owner: who, model: 'gpt-micro', replicas: 1, requestedStages: null, sessions: 4, registry: { chainId: 31337, address: registry.address, modelId: n }, idleLimitMs: HOUR_MS }, clock.t);
    state.deployments.setStatus(id, 'serving', clock.t);
    return id;
  };
  // one owner with more models serving than its budget: 12 flags set, the 13th waits
  const mine = Array.from({ length: GAS_LIMITS.registryTxsPerOwner + 1 }, () => serving(owner(1)));
  await sync.step();
  assert.equal(registry.sent.length, GAS_LIMITS.registryTxsPerOwner);
  assert.equal(logs.filter((l) => /budget of flag transactions .* is spent/.test(l)).length, 1);
  await sync.step();
  assert.equal(registry.sent.length, GAS_LIMITS.registryTxsPerOwner, 'nothing more this hour, and logged once');
  assert.equal(logs.filter((l) => /is spent/.test(l)).length, 1);
  // the waiting model is undeployed before the hour is over: its flag never needs a transaction
  state.deployments.undeploy(mine.at(-1)!, 'by its owner', clock.t);
  clock.t += HOUR_MS;
  await sync.step();
  assert.equal(registry.sent.length, GAS_LIMITS.registryTxsPerOwner);
  // many owners: everyone's flags together stay within the budget for all
  for (let o = 2; o < 2 + 20; o++) for (let k = 0; k < 4; k++) serving(owner(o));
  await sync.step();
  assert.equal(registry.sent.length, GAS_LIMITS.registryTxsPerOwner + GAS_LIMITS.registryTxs);
  clock.t += HOUR_MS;
  await sync.step();
  assert.equal(registry.sent.length, GAS_LIMITS.registryTxsPerOwner + 80, 'the rest an hour later');
  assert.ok(state.deployments.registryPending().every((d) => d.registryDeployed === (d.status !== 'undeployed')));
  state.close();
});
