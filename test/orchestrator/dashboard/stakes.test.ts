// The miners' stakes as the Network page shows them
// (src/orchestrator/dashboard/stakes.ts): read in the background, a live
// miner's at most every 30 s, at most 4 reads in flight, a failed read keeps
// the last value (and is logged, at most once a minute); the miners section
// carries what was read last and never waits for the chain.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { parseEther, type Address } from 'viem';
import { DashboardSections } from '../../../src/orchestrator/dashboard/sections.ts';
import { STAKE_EVERY_MS, STAKE_READS_IN_FLIGHT, StakeCache } from '../../../src/orchestrator/dashboard/stakes.ts';
import { Harness, newMinerId } from '../helpers.ts';

interface Pending {
  address: Address;
  resolve: (v: { staked: bigint; unstaking: bigint }) => void;
  reject: (err: Error) => void;
}

/** A reader whose reads wait until the test answers them. */
function fakeChain(): { read: (a: Address) => Promise<{ staked: bigint; unstaking: bigint }>; pending: Pending[]; reads: Address[]; maxInFlight: () => number } {
  const pending: Pending[] = [];
  const reads: Address[] = [];
  let inFlight = 0;
  let max = 0;
  const read = (address: Address): Promise<{ staked: bigint; unstaking: bigint }> => {
    reads.push(address);
    max = Math.max(max, ++inFlight);
    return new Promise<{ staked: bigint; unstaking: bigint }>((resolve, reject) => pending.push({ address, resolve, reject })).finally(() => inFlight--);
  };
  return { read, pending, reads, maxInFlight: () => max };
}

const settle = (): Promise<void> => new Promise((r) => setImmediate(r));

test('a live miner is read at once, then again only once its last read is 30 s old; a gone miner is not read; not an address: never', async () => {
  let now = 1_000_000;
  const chain = fakeChain();
  const cache = new StakeCache(chain.read, { now: () => now, log: () => {} });
  const a = newMinerId();
  assert.equal(cache.get(a), null, 'nothing read yet: the section does not wait');
  assert.equal(chain.reads.length, 1);
  chain.pending.shift()!.resolve({ staked: parseEther('12.5'), unstaking: 3n });
  await cache.idle();
  assert.deepEqual(cache.get(a), { stakedWei: '12500000000000000000', staked: '12.5', unstakingWei: '3', unstaking: '0.000000000000000003' });
  now += STAKE_EVERY_MS - 1;
  cache.get(a);
  cache.get(a);
  assert.equal(chain.reads.length, 1, 'read at most every 30 s');
  now += 1;
  cache.get(a);
  cache.get(a);
  assert.equal(chain.reads.length, 2, 'due again; one read at a time per miner');
  chain.pending.shift()!.resolve({ staked: parseEther('20'), unstaking: 0n });
  await cache.idle();
  assert.equal(cache.get(a)?.staked, '20');

  const gone = newMinerId();
  assert.equal(cache.get(gone, false), null);
  assert.equal(cache.get('not an address'), null);
  assert.equal(chain.reads.length, 2, 'neither a gone miner nor a malformed id is read');
  assert.equal(cache.busy, 0);
});

test(`at most ${STAKE_READS_IN_FLIGHT} reads in flight; the rest wait their turn`, async () => {
  const chain = fakeChain();
  const cache = new StakeCache(chain.read, { now: () => 0, log: () => {} });
  const ids = Array.from({ length: 10 }, () => newMinerId());
  for (const id of ids) cache.get(id);
  assert.equal(chain.reads.length, STAKE_READS_IN_FLIGHT);
  assert.equal(cache.busy, 10);
  while (chain.pending.length > 0) {
    chain.pending.shift()!.resolve({ staked: 1n, unstaking: 0n });
    await settle();
  }
  await cache.idle();
  assert.equal(chain.reads.length, 10, 'every one read in the end');
  assert.equal(chain.maxInFlight(), STAKE_READS_IN_FLIGHT);
  assert.deepEqual(new Set(chain.reads), new Set(ids));
  for (const id of ids) assert.equal(cache.get(id)?.stakedWei, '1');
});

test('a failed read keeps the last value and is logged at most once a minute; close() stops reading', async () => {
  let now = 0;
  const chain = fakeChain();
  const logged: string[] = [];
  const cache = new StakeCache(chain.read, { now: () => now, log: (line) => logged.push(line) });
  const a = newMinerId();
  cache.get(a);
  chain.pending.shift()!.resolve({ staked: 7n, unstaking: 0n });
  await cache.idle();
  for (let i = 0; i < 3; i++) {
    now += STAKE_EVERY_MS;
    assert.equal(cache.get(a)?.stakedWei, '7');
    chain.pending.shift()!.reject(new Error('connection refused\nat the RPC'));
    await cache.idle();
    assert.equal(cache.get(a)?.stakedWei, '7', 'the last value stays');
  }
  assert.equal(logged.length, 2, 'at 30 s, then at 90 s (a minute after)');
  assert.match(logged[0], /reading the stake of 0x[0-9a-fA-F]{40} failed: connection refused$/);
  assert.match(logged[1], /1 more failed reads since the last report/);
  // a miner never read successfully stays null
  const b = newMinerId();
  cache.get(b);
  chain.pending.shift()!.reject(new Error('timeout'));
  await cache.idle();
  assert.equal(cache.get(b), null);
  cache.close();
  now += STAKE_EVERY_MS;
  cache.get(a);
  assert.equal(chain.pending.length, 0, 'closed: nothing more is read');
});

let h: Harness | undefined;
after(() => h?.close());

test('the miners section carries each miner’s last stake read, null without a stake source; it never waits for the chain', async () => {
  h = await Harness.open();
  const a = h.join('a');
  const chain = fakeChain();
  const cache = new StakeCache(chain.read, { now: () => h!.now, log: () => {} });
  const sections = new DashboardSections(h.coordinator, null, true, () => h!.now, cache);
  assert.equal(sections.miners().find((m) => m.id === a.id)!.stake, null, 'not read yet');
  assert.equal(chain.reads.length, 1);
  chain.pending.shift()!.resolve({ staked: parseEther('100'), unstaking: parseEther('1') });
  await cache.idle();
  assert.deepEqual(sections.miners().find((m) => m.id === a.id)!.stake, { stakedWei: parseEther('100').toString(), staked: '100', unstakingWei: parseEther('1').toString(), unstaking: '1' });
  const unpaid = new DashboardSections(h.coordinator, null, false, () => h!.now);
  assert.equal(unpaid.miners().find((m) => m.id === a.id)!.stake, null);
});
