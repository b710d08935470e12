// The pipeline's hand-off of an activation whose gradient comes back before
// the answer to its send does (the receiver computes and sends the gradient
// first): the forward is still reported, with the receipt, and the microbatch
// stays held until then, so the orchestrator neither sends it again nor sees
// evidence that does not chain up.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { ForwardRecords } from '../../src/miner/forward-records.ts';
import { Pipeline, type PipelineStats } from '../../src/miner/pipeline.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';
import { Throttle } from '../../src/miner/throttle.ts';
import { gptConfig } from '../../src/model/config.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import type { PeerAccepted, StageAssignment, WorkReport } from '../../src/protocol/messages.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

const model = 'gpt-micro';
const B = 2;
const NEXT = '0x' + '2'.repeat(40);
const RECEIPT = '0x' + 'ab'.repeat(65);

function stage0(): StageRunner {
  const range = splitEvenly(gptConfig(model), 2)[0];
  const a: StageAssignment = { runId: 'r1', stage: 0, stageCount: 2, from: range.from, to: range.to, model, data: 'moby-dick', batchSize: B, seed: 7, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2 };
  return new StageRunner(engine, a, 2);
}

/** A stage-0 pipeline whose next stage is `send`; returns it with the reports it made. */
function pipelineWith(runner: StageRunner, send: (url: string, body: Uint8Array) => Promise<PeerAccepted>): { pipeline: Pipeline; reports: WorkReport[]; sends: Promise<unknown>[]; stats: PipelineStats } {
  const reports: WorkReport[] = [];
  const sends: Promise<unknown>[] = [];
  const stats: PipelineStats = { forward: 0, backward: 0, bytesSent: 0, jobTimes: { forward: { count: 0, ms: 0, msSquared: 0, cpuMs: 0 }, backward: { count: 0, ms: 0, msSquared: 0, cpuMs: 0 } } };
  const pipeline = new Pipeline({
    runner: () => runner,
    paused: () => false,
    send,
    throttle: new Throttle(1),
    records: new ForwardRecords(),
    stats,
    report: (r) => reports.push(r),
    track: (p) => sends.push(p),
    log: () => {},
  });
  pipeline.setPeers([], [{ id: NEXT, url: 'http://127.0.0.1:1', sessionKey: '0x02' + '3'.repeat(64), weight: 1 }]);
  return { pipeline, reports, sends, stats };
}

const task = { id: 5, attempt: 1, shard: 4, step: 4, ticket: '0x' + '11'.repeat(65) };

test('a gradient back before the answer to its activation: the forward is still reported with its receipt, and the microbatch is held until then', async () => {
  const runner = stage0();
  try {
    let answer!: () => void;
    let heldBetween: { microbatch: number; attempt: number }[] = [];
    // the next stage takes the activation, computes, and its gradient arrives here before its answer does
    const { pipeline, reports, sends } = pipelineWith(runner, async (_url, body) => {
      assert.ok(pipeline.expectsGradient(task.id, task.attempt, NEXT));
      const grad = new Float32Array(B * gptConfig(model).contextLength * gptConfig(model).channels).fill(1e-3);
      pipeline.push({ kind: 'backward', meta: { runId: 'r1', microbatch: task.id, attempt: task.attempt, stage: 0 }, data: grad, sha: 'c'.repeat(64) });
      await pipeline.idle();
      await new Promise<void>((r) => (answer = r));
      assert.ok(body.length > 0);
      return { queued: 0, receipt: RECEIPT };
    });
    pipeline.push({ kind: 'start', task });
    await pipeline.idle();
    for (let i = 0; i < 100 && !answer; i++) await new Promise((r) => setTimeout(r, 5));
    // the backward ran: reported, but the microbatch is still held (its forward is not reported yet)
    assert.deepEqual(reports.map((r) => r.phase), ['backward']);
    heldBetween = pipeline.heldWork();
    assert.deepEqual(heldBetween, [{ microbatch: task.id, attempt: task.attempt }]);
    assert.equal(pipeline.expectsGradient(task.id, task.attempt, NEXT), false, 'a second gradient for it is not taken');
    answer();
    await Promise.all(sends);
    const forward = reports.find((r) => r.phase === 'forward');
    assert.ok(forward, 'the forward is reported once the answer comes');
    assert.equal(forward.next, NEXT);
    assert.equal(forward.receipt, RECEIPT);
    assert.deepEqual(pipeline.heldWork(), [], 'and then let go');
  } finally {
    runner.dispose();
  }
});

test('a gradient back, then the answer to its activation lost: the microbatch is reported dropped, not left held', async () => {
  const runner = stage0();
  try {
    const { pipeline, reports, sends } = pipelineWith(runner, async () => {
      const grad = new Float32Array(B * gptConfig(model).contextLength * gptConfig(model).channels).fill(1e-3);
      pipeline.push({ kind: 'backward', meta: { runId: 'r1', microbatch: task.id, attempt: task.attempt, stage: 0 }, data: grad, sha: 'c'.repeat(64) });
      await pipeline.idle();
      throw new Error('connection reset');
    });
    pipeline.push({ kind: 'start', task });
    await pipeline.idle();
    for (let i = 0; i < 100 && sends.length === 0; i++) await new Promise((r) => setTimeout(r, 5));
    await Promise.all(sends);
    assert.deepEqual(reports.map((r) => r.phase), ['backward', 'dropped']);
    assert.deepEqual(pipeline.heldWork(), []);
  } finally {
    runner.dispose();
  }
});

test('a heartbeat timer that comes due during a job runs after the I/O that came meanwhile (whenSettled); a bare timer runs before it', async () => {
  const runner = stage0();
  // a loopback connection: what the far end writes during the job is read only when the event loop polls
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const far = new Promise<net.Socket>((r) => server.once('connection', r));
  const near = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  await new Promise<void>((r) => near.once('connect', r));
  const farEnd = await far;
  try {
    const order: string[] = [];
    near.on('data', () => order.push('io'));
    const { pipeline } = pipelineWith(runner, async () => ({ queued: 0, receipt: RECEIPT }));
    const forwardFirst = runner.forwardFirst.bind(runner);
    runner.forwardFirst = (id, shard) => {
      // during the job: a reply reaches the miner, and its heartbeat timer and another timer come due
      farEnd.write('reply');
      setTimeout(() => order.push('bare timer'), 0);
      setTimeout(() => pipeline.whenSettled(() => order.push('heartbeat')), 0);
      const until = performance.now() + 40;
      while (performance.now() < until); // the job computes on the thread
      return forwardFirst(id, shard);
    };
    pipeline.push({ kind: 'start', task });
    await pipeline.idle();
    assert.deepEqual(order, ['bare timer', 'io', 'heartbeat']);
    // with no job just ended it runs at once
    pipeline.whenSettled(() => order.push('now'));
    assert.equal(order.at(-1), 'now');
  } finally {
    near.destroy();
    farEnd.destroy();
    await new Promise((r) => server.close(r));
    runner.dispose();
  }
});

test("each job's time and CPU are added to its kind's sums (a stage-0 start is a forward), which the miner's /health shows", async () => {
  const cpuAtStart = process.cpuUsage();
  const runner = stage0();
  try {
    const { pipeline, sends, stats } = pipelineWith(runner, async () => ({ queued: 0, receipt: RECEIPT }));
    pipeline.push({ kind: 'start', task });
    await pipeline.idle();
    await Promise.all(sends);
    const grad = new Float32Array(B * gptConfig(model).contextLength * gptConfig(model).channels).fill(1e-3);
    pipeline.push({ kind: 'backward', meta: { runId: 'r1', microbatch: task.id, attempt: task.attempt, stage: 0 }, data: grad, sha: 'c'.repeat(64) });
    await pipeline.idle();
    const { forward, backward } = stats.jobTimes!;
    assert.deepEqual([forward.count, backward.count], [1, 1]);
    for (const t of [forward, backward]) {
      assert.ok(t.ms > 0, `${t.ms} ms`);
      assert.ok(Math.abs(t.msSquared - t.ms * t.ms) <= 1e-9 * t.msSquared, 'one job: the sum of squares is its square');
      // the process's CPU during the job (all its threads: the garbage collector's too, so it may exceed the job's wall time): some, and no more than the process spent since the test began
      const spent = process.cpuUsage(cpuAtStart);
      assert.ok(t.cpuMs !== undefined && t.cpuMs > 0 && t.cpuMs <= (spent.user + spent.system) / 1000, `${t.cpuMs} ms of CPU in ${t.ms} ms`);
    }
  } finally {
    runner.dispose();
  }
});

test('one forward, one backward (1F1B): after a backward a forward that can start goes next, before the other backwards; with no free slot, backwards', async () => {
  const runner = stage0(); // 2 slots
  try {
    const order: string[] = [];
    const forwardFirst = runner.forwardFirst.bind(runner);
    runner.forwardFirst = (id, shard) => (order.push(`F${id}`), forwardFirst(id, shard));
    const backward = runner.backward.bind(runner);
    runner.backward = (id, d) => (order.push(`B${id}`), backward(id, d));
    const { pipeline, sends } = pipelineWith(runner, async () => ({ queued: 0, receipt: RECEIPT }));
    const start = (id: number): { kind: 'start'; task: typeof task } => ({ kind: 'start', task: { ...task, id, shard: id, step: id } });
    const grad = (id: number) => ({ kind: 'backward' as const, meta: { runId: 'r1', microbatch: id, attempt: task.attempt, stage: 0 }, data: new Float32Array(B * gptConfig(model).contextLength * gptConfig(model).channels).fill(1e-3), sha: 'c'.repeat(64) });
    // two microbatches fill both slots; a third waits for a slot
    for (const id of [1, 2, 3]) pipeline.enqueue(start(id));
    await pipeline.pump();
    await Promise.all(sends);
    assert.deepEqual(order, ['F1', 'F2'], 'no free slot: the third waits');
    // both gradients come back: backward first, then the waiting forward in the slot it freed, then the other backward
    pipeline.enqueue(grad(1));
    pipeline.enqueue(grad(2));
    await pipeline.pump();
    await Promise.all(sends);
    assert.deepEqual(order, ['F1', 'F2', 'B1', 'F3', 'B2']);
  } finally {
    runner.dispose();
  }
});
