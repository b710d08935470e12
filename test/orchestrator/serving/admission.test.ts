// Admission on the serving path (src/orchestrator/serving/admission.ts): a
// route with room is taken at once and its miners counted; when none has
// room requests wait first come, first served and are let in as generations
// end; a full queue, a wait that runs out and a client that leaves end the
// wait with 503 / 499.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Admission, QUEUE_PER_SLOT } from '../../../src/orchestrator/serving/admission.ts';
import { OpenAiError } from '../../../src/orchestrator/serving/completion-request.ts';
import type { Peer } from '../../../src/protocol/messages.ts';

const peer = (id: string): Peer => ({ id, url: `http://127.0.0.1:1/${id}`, sessionKey: 'k', weight: 1 });

test('routes with room are taken at once; the rest wait in order and are let in as generations end; a full queue is refused at once', async () => {
  const a = new Admission({ waitMs: 10_000 });
  const room = 2;
  // one miner per stage, two stages, room for 2 generations each
  const pick = (): Peer[] | null => (a.loadOf('s0') < room && a.loadOf('s1') < room ? [peer('s0'), peer('s1')] : null);
  const first = await a.admit('d', 'model x', pick, room);
  await a.admit('d', 'model x', pick, room);
  assert.deepEqual([a.loadOf('s0'), a.loadOf('s1')], [2, 2]);
  const order: number[] = [];
  const waiting = [0, 1, 2, 3].map((i) => a.admit('d', 'model x', pick, room).then((r) => (order.push(i), r)));
  assert.equal(a.waiting('d'), QUEUE_PER_SLOT * room);
  await assert.rejects(a.admit('d', 'model x', pick, room), (e: unknown) => e instanceof OpenAiError && e.status === 503 && /busy: 2 generations at once and 4 requests waiting/.test(e.message));
  a.release(first.map((p) => p.id));
  await waiting[0];
  assert.deepEqual(order, [0]);
  a.release(['s0', 's1']);
  a.release(['s0', 's1']);
  await Promise.all(waiting.slice(1, 3));
  assert.deepEqual(order, [0, 1, 2]);
  assert.equal(a.waiting('d'), 1);
  // a failover moves a generation's count from one miner to another
  a.move('s1', 's9');
  assert.deepEqual([a.loadOf('s1'), a.loadOf('s9')], [1, 1]);
  a.release(['s0', 's9']);
  a.release(['s0', 's1']);
  await waiting[3];
  assert.deepEqual(order, [0, 1, 2, 3]);
  assert.equal(a.waiting('d'), 0);
});

test('a wait that runs out is a 503; a client that leaves ends its wait with 499; a deployment that stops serving while a request waits fails it', async () => {
  const a = new Admission({ waitMs: 300 });
  const full = (): Peer[] | null => null;
  await assert.rejects(a.admit('d', 'model x', full, 1), (e: unknown) => e instanceof OpenAiError && e.status === 503 && /no room for this request within/.test(e.message));
  let gone = false;
  const left = a.admit('e', 'model y', full, 1, () => gone);
  gone = true;
  await assert.rejects(left, (e: unknown) => e instanceof OpenAiError && e.status === 499);
  let serving = false;
  const b = new Admission({ waitMs: 5_000 });
  const stopped = b.admit('f', 'model z', () => {
    if (serving) throw new OpenAiError(503, 'model z is deployed but not serving yet', 'model_not_ready');
    return null;
  }, 1);
  serving = true;
  b.release(['nobody']);
  await assert.rejects(stopped, (e: unknown) => e instanceof OpenAiError && e.code === 'model_not_ready');
  assert.equal(b.waiting('f'), 0);
});
