// The lease of several orchestrators on one PostgreSQL database (a real
// server, started here): one holder at a time, a takeover only once it
// expired, and the fence: once another process took the lease, no write of
// the old leader commits, inside a transaction or outside one, and it is
// told once.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Lease } from '../../../src/orchestrator/cluster/lease.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { startPostgres, type PostgresServer } from '../../helpers/postgres-server.ts';

let server: PostgresServer;
let db: string;
const opened: { close(): void }[] = [];
before(async () => {
  server = await startPostgres();
  db = await server.createDatabase();
});
after(async () => {
  for (const o of opened.reverse()) o.close();
  await server?.close();
});

function lease(url: string, ttlMs: number): Lease {
  const l = Lease.open({ db, url, ttlMs });
  opened.push(l);
  return l;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

test('one holder at a time; a takeover only after the lease expired; renewing keeps it, letting go hands it over at once', async () => {
  // a ttl far above the renewal period, so a loaded machine's late timer does not let the lease lapse
  const a = lease('http://127.0.0.1:1001', 1500);
  const b = lease('http://127.0.0.1:1002', 1500);
  assert.notEqual(a.holder, b.holder);
  assert.equal(a.tryAcquire(), 1);
  assert.equal(b.tryAcquire(), null);
  // the followers learn the term's key with the leader's URL (the key they prove forwarded requests with)
  assert.match(a.forwardKey, /^[0-9a-f]{64}$/);
  assert.deepEqual(b.current(), { holder: a.holder, url: 'http://127.0.0.1:1001', term: 1, live: true, forwardKey: a.forwardKey });
  for (let i = 0; i < 4; i++) {
    await sleep(200);
    assert.equal(a.renew(), true);
    assert.equal(b.tryAcquire(), null, 'a renewed lease is not taken');
  }
  await sleep(1600);
  assert.equal(b.current()?.live, false);
  assert.equal(b.tryAcquire(), 2, 'an expired lease is taken, in a new term');
  assert.notEqual(b.forwardKey, a.forwardKey, 'each term has a key of its own');
  assert.equal(a.current()?.forwardKey, b.forwardKey);
  assert.equal(a.renew(), false, 'the old holder finds it gone');
  assert.equal(a.tryAcquire(), null);
  b.release();
  assert.equal(a.tryAcquire(), 3, 'let go: taken at once');
  a.release();
});

test("the fence: once another process holds the lease, none of the old leader's writes commits, and it is told once", async () => {
  const a = lease('http://127.0.0.1:2001', 300);
  const b = lease('http://127.0.0.1:2002', 300);
  assert.ok(a.tryAcquire() !== null, 'the first test let go');
  let lost = 0;
  const state = OrchestratorState.open(db, { fence: a.fence(() => lost++) });
  opened.push(state);
  const now = Date.now();
  state.miners.upsert(minerRecord('m-1'), now);
  state.tx(() => state.miners.upsert(minerRecord('m-2'), now));
  assert.deepEqual(state.miners.list().map((m) => m.id).sort(), ['m-1', 'm-2'], 'the holder writes');
  assert.equal(lost, 0);

  await sleep(350);
  assert.ok(b.tryAcquire() !== null, 'b took over');
  const refused = (fn: () => void): void =>
    assert.throws(fn, (err: unknown) => err instanceof NimbleError && err.code === 'unavailable' && /no longer leads/.test(err.message));
  refused(() => state.miners.upsert(minerRecord('m-3'), now));
  refused(() => state.tx(() => state.miners.upsert(minerRecord('m-4'), now)));
  refused(() => state.miners.touch('m-1', now + 1));
  assert.equal(lost, 1, 'told once');
  // reads still answer; nothing of the refused writes is there
  const reader = OrchestratorState.open(db);
  opened.push(reader);
  assert.deepEqual(reader.miners.list().map((m) => m.id).sort(), ['m-1', 'm-2']);
  assert.equal(reader.miners.get('m-1')?.lastSeen, now);
});

function minerRecord(id: string): Parameters<OrchestratorState['miners']['upsert']>[0] {
  return { id, name: id, url: `http://127.0.0.1:9/${id}`, gflops: 1, threads: 1, memoryBytes: 1 << 30, bandwidthMbps: 100, sessionKey: 'a'.repeat(43), serve: 'both', backend: 'wasm', adapter: null, softwareAdapter: false };
}
